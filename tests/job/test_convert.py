"""What each magic becomes in an exported script (nbdist.job.convert), with the magics' own flag parsers."""

from __future__ import annotations

import nbformat
import pytest
from IPython.core.magic_arguments import parse_argstring

from nbdist.errors import ExportError
from nbdist.job import convert, params
from nbdist.magics import DistMagics


def _export(*cells: str | tuple[str, list[str]], allow: bool = False) -> convert.Script:
    nb = nbformat.v4.new_notebook()
    for cell in cells:
        src, tags = (cell, []) if isinstance(cell, str) else cell
        nb.cells.append(nbformat.v4.new_code_cell(src, metadata={"tags": tags}))
    return convert.export(nb, "t.ipynb", lambda line: parse_argstring(DistMagics.dist_init, line),
                          lambda line: parse_argstring(DistMagics.collective, line), allow)


def test_dist_init_keeps_the_backend_flags_and_gives_rank_and_master_to_the_launcher():
    text = _export("%load_ext nbdist", "%dist_init --rank 1 --world-size 2 --master-addr 10.0.0.1 --backend hccl "
                   "--env HCCL_BUFFSIZE=400 --pg-timeout 900 --debug stdout").text
    assert "_world = nbdist.script.init(globals(), backend='hccl', env=['HCCL_BUFFSIZE=400'], pg_timeout='900', " \
           "debug='stdout')" in text
    assert "# --rank --world-size --master-addr: the launcher's, in a script" in text
    assert text.index("import nbdist.script") < text.index("import torch  #")
    compile(text, "t.py", "exec")


def test_the_cell_form_keeps_its_body_before_the_call():
    text = _export("%%dist_init --spawn 2\nBACKEND = 'gloo'\nRANK = 0").text
    assert text.index("BACKEND = 'gloo'") < text.index("nbdist.script.init(globals())")
    assert "# --spawn: the launcher's, in a script" in text


def test_magics_become_what_they_do_in_a_job():
    text = _export("%dist_init", "%dist_status\n%dist_workers\n%dist_barrier", "%dist_destroy").text
    assert "dist.barrier()  # %dist_barrier" in text
    assert "# %dist_status: shows only, left out" in text and "# %dist_workers: shows only, left out" in text
    assert "# %dist_destroy: the world ends when the script exits" in text
    assert "nbdist.script.out(dist.barrier" not in text


@pytest.mark.parametrize("cell,why", [("%dist_debug on", "%%dist_init --debug"), ("%timeit 1 + 1", "IPython"),
                                      ("x = !ls", "IPython"), ("%dist_bench", "nbdist bench")])
def test_a_line_with_no_script_form_is_refused_naming_cell_and_line(cell, why):
    with pytest.raises(ExportError, match=f"cell 2, line 2: .* has no script form.*{why}"):
        _export("%dist_init", f"y = 2\n{cell}")


def test_another_cell_magic_is_refused_or_kept_as_a_comment():
    with pytest.raises(ExportError, match=r"cell 2, line 1: %%time has no script form"):
        _export("%dist_init", "%%time\nx = 1")
    script = _export("%dist_init", "%%time\nx = 1", allow=True)
    assert "#   %%time" in script.text and "#   x = 1" in script.text
    assert script.notes == ["cell 2: %%time kept as a comment (--allow-ipython)"]


def test_skipped_and_failing_cells_are_left_out_as_comments():
    failing = ("%%collective\nraise ValueError", ["raises-exception"])
    script = _export("%dist_init", ("boom()", ["nbdist-skip"]), failing)
    assert "#   boom()" in script.text and "#   raise ValueError" in script.text
    assert len(script.notes) == 2 and "raises-exception" in script.notes[1]
    compile(script.text, "t.py", "exec")


def test_ranks_indents_the_body_but_not_inside_a_string_that_spans_lines():
    text = _export("%dist_init", "%%collective --ranks 0-1,3 --max-time 5\ns = '''a\nb'''\ns").text
    assert "if RANK in nbdist.script.on_ranks('0-1,3'):" in text
    assert "    s = '''a\nb'''\n    nbdist.script.out(s)" in text


@pytest.mark.parametrize("body,printed", [("x = 1\nx", "nbdist.script.out(x)"), ("x = 1\nx;", None),
                                          ("f(\n  1,\n  2)  # call", "nbdist.script.out(f(\n  1,\n  2))  # call"),
                                          ("for i in range(2):\n    i", None), ("x = 1", None)])
def test_a_cells_last_expression_is_printed_as_its_out_row(body, printed):
    text = _export("%dist_init", f"%%collective\n{body}").text
    if printed is None:
        assert "nbdist.script.out(" not in text
    else:
        assert printed in text


def test_a_collective_before_dist_init_and_a_notebook_without_it_are_refused():
    with pytest.raises(ExportError, match="before %%dist_init"):
        _export("%%collective\nx = 1", "%dist_init")
    with pytest.raises(ExportError, match="never runs %%dist_init"):
        _export("x = 1")


def test_the_parameters_cell_gives_flags_but_not_the_launchers_names():
    text = _export(("epochs = 5\nlr: float = 0.1\nRANK = 0\nSPAWN = 2", ["parameters"]), "%dist_init").text
    assert "globals().update(nbdist.script.parameters({'epochs': epochs, 'lr': lr}))" in text
    assert params.parameters({"epochs": 5, "opt_name": "sgd"}, ["--epochs", "3", "--opt-name", "adam"]) == {
        "epochs": 3, "opt_name": "adam"}
    assert params.parameters({"x": 1}, ["--x", "[1, 2]"]) == {"x": [1, 2]}
    assert params.parameters({"x": 1}, ["--x", "not a literal"]) == {"x": "not a literal"}


def test_a_last_expression_with_trailing_blanks_is_still_printed():
    assert "nbdist.script.out('ok')" in _export("%dist_init", "%%collective\nx = 1\n'ok' \n\n").text


def test_the_collective_flags_a_script_has_no_use_for_are_named_in_a_comment():
    text = _export("%dist_init", "%%collective --max-time 5 --trace --ranks 0\nx = 1").text
    assert "# %%collective --max-time --trace: nbdist's checks, limits and views; none in a script" in text
    assert "if RANK in nbdist.script.on_ranks('0'):" in text
