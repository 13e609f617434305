"""The short soak (benchmarks/soak.py --short): random faults and stop presses in every mode, none left out of step.

12 stop presses during loops of all_reduce (2 ranks), then 4 random faults in each mode: lockstep on 2
and 4 ranks, driven from one kernel (--spawn 3), and plain cells. The long version (3 seeds x 200
presses, 150 faults per mode) is run by hand; its figures are in the README's fault section.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


@pytest.mark.timeout(900)
def test_the_short_soak_finds_no_hang_no_world_out_of_step_no_lost_output_and_no_slow_stop(tmp_path: Path):
    figures = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(SOAK), "--short", "--json", str(figures)], capture_output=True,
                         text=True, timeout=850)
    assert figures.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(figures.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["presses", "lockstep2", "lockstep4", "driven", "plain"]
    for r in rows:
        expected = 12 if r["mode"] == "presses" else 4
        assert r["faults"] == expected, r
        assert (r["hangs"], r["out_of_step"], r["lost"], r["slow_stops"]) == (0, 0, 0, 0), r
        assert r["normal_cells"] >= (2 if r["mode"] == "presses" else 4), r
    assert run.returncode == 0, run.stdout[-3000:]
