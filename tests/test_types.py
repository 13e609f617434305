"""The type checker holds on all of nbdist: mypy, strict on the whole package, as ``mypy --strict -p nbdist``
(its settings are pyproject.toml's ``[tool.mypy]``: ``files = ["nbdist"]``, ``strict = true``). session.py is
checked also against the Protocols by which the layers below name what they need of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_strict_finds_no_error_in_nbdist():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues found" in done.stdout
