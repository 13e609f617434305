"""The type checker holds on the lockstep protocol: mypy, strict on ``nbdist/world``, ``nbdist/cell``,
``nbdist/drive/follow.py``, the session's other parts (``drive/driving.py``, ``backend/state.py``) and the
modules that take the session whole (``backend/debugmode.py``, ``measure/bench.py``, ``measure/dashboard.py``),
and on ``nbdist/session.py`` against the Protocols the layers below declare (its settings are pyproject.toml's
``[tool.mypy]``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error_in_the_protocols_packages():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues found" in done.stdout
