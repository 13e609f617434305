"""Choosing a backend and a device, without breaking ``import torch``.

NPUs are detected before torch is imported (:mod:`nbdist.backend.ascend`): if torch_npu
is installed but cannot work here (CANN missing or misconfigured, no NPU
visible), torch's automatic loading of backend extensions would make every
``import torch`` in the kernel fail, so nbdist turns that loading off and
falls back to another backend, saying why. hccl is chosen only when an NPU is
visible.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError
from . import ascend

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Choice:
    """The backend and device chosen for this rank, and why."""

    backend: str
    device: str
    reason: str
    npu: ascend.Facts = field(default_factory=ascend.Facts)
    warnings: tuple[str, ...] = ()


def npu_status(count: bool = True) -> tuple[bool, str, ascend.Facts]:
    """(usable, explanation, facts) for NPUs, decided without importing torch or torch_npu in this process."""
    facts = ascend.gather(count=count)
    if facts.problem is not None:
        return False, facts.problem, facts
    return True, f"an NPU is visible ({ascend.describe(facts)})" if count else "torch_npu and CANN are present", facts


def guard_torch_import(facts: ascend.Facts) -> list[str]:
    """Keep a broken torch_npu from breaking ``import torch`` (only before torch loads); returns warnings."""
    if facts.problem is None or "torch" in sys.modules or importlib.util.find_spec("torch_npu") is None:
        return []
    warnings = []
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "1":
        warnings.append(f"nbdist set TORCH_DEVICE_BACKEND_AUTOLOAD=0 although it was 1: {facts.problem}, and with "
                        "autoload on every `import torch` in this kernel would fail")
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return warnings


def choose(backend: str, device: str | None, local_rank: int) -> Choice:
    """Pick the backend (``auto`` = hccl, nccl, gloo in that order) and the device."""
    npu_usable, npu_why, facts = npu_status()
    warnings = tuple(guard_torch_import(facts))
    import torch

    cuda = torch.cuda.is_available()
    if backend == "auto":
        if npu_usable:
            backend, reason = "hccl", npu_why
        elif cuda:
            backend, reason = "nccl", f"CUDA is available; {npu_why}"
        else:
            backend, reason = "gloo", f"{npu_why}; no CUDA"
    elif backend == "hccl" and not npu_usable:
        raise ConfigError(f"--backend hccl cannot work here: {npu_why}")
    elif backend == "nccl" and not cuda:
        raise ConfigError("--backend nccl cannot work here: torch sees no CUDA device")
    else:
        reason = "chosen with --backend"
    if device is None:
        kind = {"hccl": "npu", "nccl": "cuda"}.get(backend)
        device = f"{kind}:{local_rank}" if kind else "cpu"
    elif device.isdigit():
        kind = {"hccl": "npu", "nccl": "cuda"}.get(backend, "cpu")
        device = "cpu" if kind == "cpu" else f"{kind}:{device}"
    return Choice(backend, device, reason, facts, warnings)


def activate(choice: Choice) -> torch.device:
    """Make the chosen device current; returns it as a ``torch.device``."""
    import torch

    dev = torch.device(choice.device)
    if dev.type == "npu":
        import torch_npu  # noqa: F401  (registers the npu device type)

        torch.npu.set_device(dev)  # type: ignore[attr-defined]  # torch_npu's, registered at import
    elif dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev
