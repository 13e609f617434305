"""Each rank's column is what its notebook would have shown: real kernels, one shared two-rank world.

Pictures are compared by their bytes, outputs keep their order, a DataFrame renders as a sanitised table,
a stopped rank says where it was, and an output too large for the store leaves a note.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels

from .conftest import lend, ok


@pytest.fixture
def world(shared) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared)


def _table(r: kernels.Result) -> str:
    return r.displays()[-1]


@pytest.mark.timeout(180)
def test_two_ranks_plots_that_differ_are_each_shown_never_marked_identical(world):
    code = ("%%collective\nimport matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
            "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 1))\nplt.plot([0, RANK])\nplt.show()\n")
    for r in ok(kernels.execute_all(world, code, timeout=120)):
        html = _table(r)
        pictures = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
        assert len(pictures) == 2 and pictures[0] != pictures[1], "each rank's own plot, both shown"
        assert "identical" not in html and "differs between ranks" in html


@pytest.mark.timeout(120)
def test_each_column_lists_stream_text_displays_and_out_in_the_order_produced(world):
    code = ("%%collective\nimport sys\nprint('one'); display('two'); print('three')\n"
            "print('four', file=sys.stderr); print('five')\nRANK * 0 + 6\n")
    for r in ok(kernels.execute_all(world, code, timeout=60)):
        text = r.text()
        positions = [text.index(word) for word in ("one", "'two'", "three", "four", "five", "Out: 6")]
        assert positions == sorted(positions), text
        html = _table(r)
        assert html.index("one") < html.index("&#x27;two&#x27;") < html.index("three") < html.index("four")


@pytest.mark.timeout(120)
def test_a_dataframe_renders_as_its_table_without_its_style_block(world):
    code = ("%%collective\nimport pandas as pd\n"
            "pd.DataFrame({'rank': [RANK], 'value': [RANK * 10]})\n")
    for r in ok(kernels.execute_all(world, code, timeout=60)):
        html = _table(r)
        assert html.count('class="dataframe"') == 2 and "<style" not in html  # one per rank: they differ
        assert "<td>10</td>" in html


@pytest.mark.timeout(180)
def test_a_rank_stopped_inside_all_reduce_shows_that_line_not_nbdists_frames(world):
    code = ("%%collective --timeout 60\nimport time\nt = torch.ones(1)\nif RANK == 1:\n    time.sleep(1)\n"
            "    1 / 0\ndist.all_reduce(t)\n")
    results = kernels.execute_all(world, code, timeout=120)
    assert [r.status for r in results] == ["error", "error"]
    text, html = results[0].text(), _table(results[0])
    assert re.search(r"stopped in `dist\.all_reduce\(t\)`, line 7, because rank 1 \([^)]*\) raised "
                     r"ZeroDivisionError", text.replace("\n  ", " ")), text
    shown, hidden = html.split("<details>", 1)[0], html.split("<details>", 1)[1]
    assert "fingerprint.py" not in shown and "fingerprint.py" in hidden  # the full traceback, one click away
    rank1 = _table(results[1])
    assert "ZeroDivisionError" in rank1 and "1 / 0" in rank1


@pytest.mark.timeout(120)
def test_an_image_too_large_for_the_store_leaves_a_note_in_its_column(world):
    code = ("%%collective\nimport os\nfrom IPython.display import Image, display\n"
            "display(Image(data=b'\\x89PNG' + os.urandom(5 * 1024 * 1024), format='png'))\nprint('after')\n")
    for r in ok(kernels.execute_all(world, code, timeout=120)):
        html = _table(r)
        assert "image/png, 7.0 MB, not shown: this rank&#x27;s output was over nbdist&#x27;s 4.2 MB limit" in html
        assert "after" in html
