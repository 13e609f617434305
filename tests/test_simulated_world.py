"""``benchmarks/simulated_world.py`` keeps working: a world of 4 simulated ranks runs 2 cells against a real store.

The benchmark's big sizes take minutes and are run by hand (docs/development/benchmarks.md); this runs its
smallest useful world, so that a change to the turn code, the explorer's kernel or the store client that the
script relies on fails here rather than at the next recording.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "simulated_world.py"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shows", ["one", "all"])
def test_four_simulated_ranks_run_two_cells_and_every_rank_counts_its_store_traffic(shows: str):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--world-sizes", "4", "--cells", "2", "--warmup", "1", "--shows", shows,
         "--no-record"], cwd=ROOT, capture_output=True, text=True, timeout=220,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})
    assert done.returncode == 0, done.stdout + done.stderr
    line = re.search(r"^\s*4 ranks \(2 hosts.*latency ([\d.]+) ms.*?(\d+) ops \(([\d.]+)/rank\), ([\d.]+) kB.*"
                     r"server CPU ([\d.]+) ms", done.stdout, re.MULTILINE)
    assert line, done.stdout
    latency, ops, per_rank, kilobytes, server = map(float, line.groups())
    assert 0 < latency < 60_000
    assert per_rank >= 5, "each rank's cell takes a turn, meets twice and publishes its record through the store"
    assert ops == pytest.approx(4 * per_rank, abs=1)
    assert kilobytes > 0 and server > 0


def test_the_plot_has_a_panel_for_latency_traffic_and_cpu_and_is_an_svg(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("simulated_world", SCRIPT)
    assert spec is not None and spec.loader is not None
    sys.path.insert(0, str(SCRIPT.parent))  # its _common
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    sizes = [{"size": n, "latency_ms": n, "latency_p90_ms": 2 * n, "ops": 16 * n, "bytes": 200 * n,
              "bytes_per_rank": 200, "server_cpu_ms": n / 10, "hosts_cpu_ms": n} for n in (2, 16)]
    path = tmp_path / "plot.svg"
    module.plot({"shows": "one", "machine": "test", "sizes": sizes}, path)
    text = path.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for title in ("latency per cell", "store traffic per cell", "CPU per cell"):
        assert title in text
