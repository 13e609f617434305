"""What the benchmark scripts share: the load note, and recording their figures where the docs include them.

A script calls :func:`begin` when it begins and :func:`record` when it has measured: ``record`` writes
``docs/figures/NAME.json`` (each headline figure with its median, spread and number of runs, and what it
was measured on) and ``docs/figures/NAME.md``, the snippet ``docs/development/benchmarks.md`` includes.
The snippet is rendered from the JSON alone (:func:`render`), so the page shows nothing the JSON lacks,
and ``tests/test_figures.py`` renders it again to catch a hand edit.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures"


def load_note(when: str, judge: bool = True) -> str:
    """The 1-minute load average: other work on this machine inflates every figure."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    busy = ""
    if judge and load > 0.5 * cores:
        busy = " (busy: other processes compete for the cores; figures are inflated)"
    return f"load average {when}: {load:.2f} on {cores} cores{busy}"


@dataclass(frozen=True)
class Start:
    """When a benchmark began, and how busy the machine was then."""

    date: str  # UTC
    load: tuple[float, float, float]
    clock: float  # time.monotonic()


def begin() -> Start:
    now = datetime.datetime.now(datetime.timezone.utc)
    return Start(now.strftime("%Y-%m-%d %H:%M UTC"), os.getloadavg(), time.monotonic())


def figure(what: str, samples: Sequence[float], unit: str, *, spread: str = "IQR", median: float | None = None,
           runs: int | None = None, decimals: int = 2, signed: bool = False, target: str | None = None,
           met: bool | None = None) -> dict[str, Any]:
    """One headline figure: the median of ``samples`` (or ``median``, derived from them) and their spread.

    ``spread`` is ``"IQR"`` (quartiles) or ``"min–max"``; no samples, no spread. ``target`` is its text
    ("≤ 3 ms"), ``met`` the script's verdict on it.
    """
    values = sorted(samples)
    low = high = None
    if len(values) >= 2 and spread == "IQR":
        low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    elif values:
        low, high = values[0], values[-1]
    row: dict[str, Any] = {
        "figure": what, "unit": unit, "median": statistics.median(values) if median is None else median,
        "low": low, "high": high, "spread": spread if values else None,
        "runs": len(values) if runs is None else runs, "decimals": decimals, "signed": signed,
    }
    if target is not None:
        row.update(target=target, met=bool(met))
    return row


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


def _os_name() -> str:
    name = platform.system()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return f"{name}, {platform.system()} {platform.release()}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> str:
    """The short hash of HEAD, with ``+dirty`` when the tree differs from it (the figures themselves aside)."""
    head = _git("rev-parse", "--short", "HEAD")
    if head is None:
        return "unknown"
    changes = _git("status", "--porcelain", "--", ".", f":(exclude){FIGURES.relative_to(ROOT)}")
    return head + ("+dirty" if changes else "")


def record(name: str, title: str, rows: list[dict[str, Any]], began: Start, notes: Sequence[str] = ()) -> Path:
    """Write ``docs/figures/NAME.json`` and its snippet ``NAME.md``; returns the JSON's path."""
    data = {
        "name": name,
        "title": title,
        "command": shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
        "date": began.date,
        "seconds": round(time.monotonic() - began.clock),
        "machine": {
            "cpu": _cpu_model(), "cores": os.cpu_count(), "ram_gib": _ram_gib(), "os": _os_name(),
            "load_average_at_start": [round(v, 2) for v in began.load],
            "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
        },
        "python": platform.python_version(),
        "torch": _version("torch"),
        "nbdist": _version("nbdist"),
        "commit": commit(),
        "rows": rows,
        "notes": list(notes),
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    path = FIGURES / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    (FIGURES / f"{name}.md").write_text(render(data))
    print(f"figures written to {path.relative_to(ROOT)} and {name}.md")
    return path


def _number(value: float, row: dict[str, Any]) -> str:
    return f"{value:{'+' if row['signed'] else ''}.{row['decimals']}f}"


def render(data: dict[str, Any]) -> str:
    """The MyST snippet for one benchmark's figures: a table, then what they were measured on. Pure."""
    rows = data["rows"]
    targets = any("target" in r for r in rows)
    lines = [f"**{data['title']}**", "",
             "| figure | median | spread | runs |" + (" target |" if targets else ""),
             "|---|---|---|---|" + ("---|" if targets else "")]
    for r in rows:
        unit = r["unit"] if r["unit"] in ("", "x", "%") else f" {r['unit']}"
        spread = "–"
        if r["low"] is not None:
            spread = f"{_number(r['low'], r)} to {_number(r['high'], r)}{unit} ({r['spread']})"
        line = f"| {r['figure']} | {_number(r['median'], r)}{unit} | {spread} | {r['runs']} |"
        if targets:
            line += f" {r['target']}: **{'met' if r['met'] else 'not met'}** |" if "target" in r else " |"
        lines.append(line)
    m = data["machine"]
    ram = f", {m['ram_gib']:g} GiB RAM" if m["ram_gib"] else ""
    lines += ["", *(f"{note}" for note in data["notes"]), *([""] if data["notes"] else []),
              f"Measured on {m['cpu']} ({m['cores']} cores{ram}; {m['os']}; load average "
              f"{m['load_average_at_start'][0]:.2f} at start, {m['load_average_at_end'][0]:.2f} at the end), "
              f"Python {data['python']}, torch {data['torch']}, nbdist {data['nbdist']}, at commit "
              f"`{data['commit']}` on {data['date']}, by `{data['command']}` ({data['seconds']} s)."]
    return "\n".join(lines) + "\n"


def not_recorded(command: str) -> str:
    """The snippet a page includes until ``command`` has run and written the figures in its place."""
    return f"*Not yet recorded: run `{command}`; it writes its figures here.*\n"
