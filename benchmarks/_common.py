"""What the benchmark scripts share."""

from __future__ import annotations

import os


def load_note(when: str, judge: bool = True) -> str:
    """The 1-minute load average: other work on this machine inflates every figure."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    busy = ""
    if judge and load > 0.5 * cores:
        busy = " (busy: other processes compete for the cores; figures are inflated)"
    return f"load average {when}: {load:.2f} on {cores} cores{busy}"
