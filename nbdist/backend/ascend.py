"""The Ascend stack on this host, learnt without importing torch or torch_npu.

torch_npu without a working CANN breaks every ``import torch`` in the kernel
(torch loads installed backend extensions itself), so everything here comes
from package metadata, files, ``npu-smi`` and, at most, a short subprocess.

Sources (read, not run: no NPU was available), Ascend/pytorch at tag
``v26.2.0-beta.1-pytorch2.13.0`` unless said otherwise:

- ``torch_npu/_init/registry/registry_manager.py:19-64`` (``_cann_package_check``):
  with ``ASCEND_HOME_PATH`` set, ``import torch_npu`` raises when that path, the
  ``ASCEND_OPP_PATH`` variable or path, or ``runtime/`` or ``compiler/`` under
  the home path is missing (the 2.12 line: ``torch_npu/utils/npu_intercept.py:25-70``).
- ``torch_npu/utils/collect_env.py:75-89``: the CANN version is the ``version=``
  line of the first ``ascend_*_install.info`` under ``ASCEND_HOME_PATH``.
- ``torch_npu/csrc/core/npu/register/OptionsManager.cpp:215-234``: this release
  reads ``TORCH_HCCL_ASYNC_ERROR_HANDLING``, and ``HCCL_ASYNC_ERROR_HANDLING`` only
  when that is unset (with a deprecation warning). Releases before 26.2.0, e.g.
  branch ``v2.12.0-26.1.0`` (``OptionsManager.cpp:232-242``), read only the old
  name. The rename came with release 26.2.0 on every torch line it builds
  (2.7.1 to 2.13), and a torch_npu version number (``2.12.0``) does not say its
  release, so nbdist looks for the new name in the installed ``libtorch_npu.so``.
- ``torch_npu/csrc/core/npu/NpuVariables.cpp:13-41``: SoC names by generation:
  ``Ascend910A/ProA/ProB/PremiumA`` and a bare ``Ascend910B`` are the first Atlas
  training generation; ``Ascend910B1``-``B4`` are Atlas A2; ``Ascend910_93xx`` are A3.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import mmap
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

# ``import torch_npu`` needs all three (its own import errors name libhccl.so and libascendcl.so:
# torch_npu/_init/core/module_loader.py:120-153).
REQUIRED_LIBS = ("libhccl.so", "libascend_hal.so", "libascendcl.so")
NEW_ERROR_VAR = "TORCH_HCCL_ASYNC_ERROR_HANDLING"
OLD_ERROR_VAR = "HCCL_ASYNC_ERROR_HANDLING"
PROBE_SECONDS = 60.0  # the device-count subprocess imports torch and torch_npu: seconds, not milliseconds

# Families, as the CANN documents name products.
A1 = "Atlas training (first generation)"
A2 = "Atlas A2 training"
A3 = "Atlas A3 training"


@dataclass(frozen=True)
class Facts:
    """What nbdist knows of torch_npu, CANN and the NPUs here; None where it cannot tell."""

    torch_npu: str | None = None  # package version, from its metadata
    error_var: tuple[str, ...] = (NEW_ERROR_VAR, OLD_ERROR_VAR)  # the variable(s) this torch_npu reads
    error_var_why: str = "torch_npu is not installed here: both names are set, each release reads one"
    cann: str | None = None
    chip: str | None = None  # e.g. "910B3"
    family: str | None = None  # A1, A2, A3 or None
    devices: int | None = None  # NPUs visible; None: not counted
    problem: str | None = None  # why torch_npu cannot work here (None: it can)
    autoload_forced: bool = False  # TORCH_DEVICE_BACKEND_AUTOLOAD=1 set by the user


def family_of(chip: str | None) -> str | None:
    """The product family of a SoC name such as ``910B3`` or ``Ascend910B3`` (NpuVariables.cpp:13-41)."""
    if not chip:
        return None
    name = chip.strip().removeprefix("Ascend")
    if re.fullmatch(r"910B\d\w*(-\d+)?", name):
        return A2
    if re.fullmatch(r"910(_93\d\d)?", name):
        return A3
    if name in ("910A", "910ProA", "910ProB", "910PremiumA", "910B"):
        return A1
    return None


def package_problem(environ: Mapping[str, str]) -> str | None:
    """Why torch_npu's own CANN package check would raise at import (registry_manager.py:19-64), or None."""
    home = environ.get("ASCEND_HOME_PATH")
    if home is None:
        return None  # torch_npu only prints a warning then
    if not os.path.exists(home):
        return f"ASCEND_HOME_PATH is {home}, which does not exist"
    opp = environ.get("ASCEND_OPP_PATH")
    if opp is None:
        return "ASCEND_HOME_PATH is set but ASCEND_OPP_PATH is not (the opp package, or `source set_env.sh`)"
    if not os.path.exists(opp):
        return f"ASCEND_OPP_PATH is {opp}, which does not exist"
    for part in ("runtime", "compiler"):
        if not os.path.exists(os.path.join(home, part)):
            return f"{os.path.join(home, part)} does not exist (the CANN {part} package)"
    return None


def cann_version(environ: Mapping[str, str]) -> str | None:
    """CANN's version from its ``ascend_*_install.info`` (as torch_npu's collect_env reads it)."""
    home = environ.get("ASCEND_HOME_PATH") or "/usr/local/Ascend/ascend-toolkit/latest"
    root = Path(home)
    if not root.is_dir():
        return None
    for path in sorted(root.glob("ascend_*_install.info")) + sorted(root.glob("*/ascend_*_install.info")):
        try:
            for line in path.read_text(errors="replace").splitlines():
                if "version" in line and "=" in line:
                    return line.strip().split("=")[-1]
        except OSError:
            continue
    return None


def torch_npu_location() -> Path | None:
    spec = importlib.util.find_spec("torch_npu")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def error_variables(version: str | None, library: Path | None) -> tuple[tuple[str, ...], str]:
    """The async-error-handling variable(s) the installed torch_npu reads, and how nbdist knows."""
    if library is not None:
        try:
            with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                new = m.find(NEW_ERROR_VAR.encode() + b"\0") != -1
            if new:
                return (NEW_ERROR_VAR,), (f"torch_npu {version} reads {NEW_ERROR_VAR} (its library names it; "
                                          f"{OLD_ERROR_VAR} only as a deprecated fallback)")
            return (OLD_ERROR_VAR,), f"torch_npu {version} reads only {OLD_ERROR_VAR} (its library has no other name)"
        except (OSError, ValueError):
            pass  # unreadable: decide by the version below
    if version is None:
        return (NEW_ERROR_VAR, OLD_ERROR_VAR), Facts.error_var_why
    if _line(version) >= (2, 13):
        return (NEW_ERROR_VAR,), (f"torch_npu {version}: the 2.13 line began with release 26.2.0, "
                                  f"which reads {NEW_ERROR_VAR}")
    return (NEW_ERROR_VAR, OLD_ERROR_VAR), (f"torch_npu {version}: its library could not be read and its release is "
                                            "unknown, so both names are set (each release reads one)")


def _line(version: str) -> tuple[int, int]:
    parts = re.findall(r"\d+", version)[:2]
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 else (0, 0)


def missing_libraries() -> list[str]:
    missing = []
    for lib in REQUIRED_LIBS:
        try:
            ctypes.CDLL(lib)
        except OSError:
            missing.append(lib)
    return missing


def count_devices(environ: Mapping[str, str]) -> tuple[int | None, str | None, str]:
    """(NPUs visible, chip name, how it was learnt): ``npu-smi`` if present, else a short subprocess.

    The kernel itself never imports torch_npu to find out: a broken one would break ``import torch``.
    """
    smi = shutil.which("npu-smi", path=environ.get("PATH"))
    if smi is not None:
        try:
            listing = subprocess.run([smi, "info", "-l"], capture_output=True, text=True, timeout=10,
                                     env=dict(environ))
            table = subprocess.run([smi, "info"], capture_output=True, text=True, timeout=10, env=dict(environ))
        except (OSError, subprocess.SubprocessError) as exc:
            return None, None, f"npu-smi failed: {exc}"
        count = re.search(r"Total Count\s*:\s*(\d+)", listing.stdout)
        chip = re.search(r"^\|\s*\d+\s+(\w[\w-]*)\s+\|", table.stdout, re.MULTILINE)
        if count is None:
            said = (listing.stderr or listing.stdout)[-200:]
            return None, None, f"npu-smi info -l printed no device count ({said!r})"
        visible = int(count.group(1))
        shown = environ.get("ASCEND_RT_VISIBLE_DEVICES")
        if shown is not None and shown.strip():
            visible = min(visible, len([d for d in shown.split(",") if d.strip()]))
        return visible, chip.group(1) if chip else None, "npu-smi"
    code = ("import torch, torch_npu; n = torch.npu.device_count(); "
            "print('NBDIST', n, torch.npu.get_device_name(0) if n else '')")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_SECONDS,
                              env={**environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    except subprocess.TimeoutExpired:
        return None, None, f"importing torch_npu in a subprocess took over {PROBE_SECONDS:g} s"
    except OSError as exc:
        return None, None, f"could not start a subprocess: {exc}"
    found = re.search(r"^NBDIST (\d+) ?(\S*)$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or found is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, None, f"import torch_npu failed in a subprocess: {last[:300]}"
    return int(found.group(1)), found.group(2) or None, "torch_npu, in a subprocess"


def gather(environ: Mapping[str, str] | None = None, count: bool = True) -> Facts:
    """Facts about this host's Ascend stack; ``count=False`` skips the device count (no subprocess)."""
    environ = os.environ if environ is None else environ
    # What nbdist itself sets for a world does not change these facts: left out of the cache key.
    return _gather(frozenset((k, v) for k, v in environ.items() if not k.startswith(_NOT_FACTS)), count)


_NOT_FACTS = ("HCCL_", "TORCH_HCCL_", "GLOO_", "NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "RANK", "WORLD_SIZE",
              "LOCAL_RANK", "MASTER_")


@functools.lru_cache(maxsize=8)  # the device count costs a subprocess: once per environment
def _gather(items: frozenset[tuple[str, str]], count: bool) -> Facts:
    environ = dict(items)
    forced = environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "") == "1"
    location = torch_npu_location()
    if location is None:
        return Facts(problem="torch_npu is not installed", autoload_forced=forced)
    try:
        version: str | None = importlib.metadata.version("torch_npu")
    except importlib.metadata.PackageNotFoundError:
        version = None
    library = location / "lib" / "libtorch_npu.so"
    error_var, error_why = error_variables(version, library if library.exists() else None)
    base = Facts(torch_npu=version, error_var=error_var, error_var_why=error_why, cann=cann_version(environ),
                 autoload_forced=forced)
    missing = missing_libraries()
    if missing:
        return replace(base, problem=f"torch_npu is installed but the CANN library {missing[0]} was not found")
    problem = package_problem(environ)
    if problem is not None:
        return replace(base, problem=f"torch_npu's own CANN check would fail at import: {problem}")
    if not count:
        return base
    devices, chip, how = count_devices(environ)
    facts = replace(base, devices=devices, chip=chip, family=family_of(chip))
    if devices is None:
        return replace(facts, problem=f"could not count NPUs ({how})")
    if devices == 0:
        return replace(facts, problem=f"torch_npu and CANN are present but no NPU is visible ({how})")
    return facts


def describe(facts: Facts) -> str:
    """One line for the init summary and the doctor."""
    if facts.torch_npu is None and facts.problem == "torch_npu is not installed":
        return facts.problem
    parts = [f"torch_npu {facts.torch_npu or '(version unknown)'}", f"CANN {facts.cann or '(version unknown)'}"]
    if facts.devices is not None:
        parts.append(f"{facts.devices} NPU(s)" + (f" ({facts.chip}, {facts.family or 'family unknown'})"
                                                   if facts.chip else ""))
    return ", ".join(parts)
