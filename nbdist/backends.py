"""Choosing a backend and a device, without breaking ``import torch``.

NPUs are detected before torch is imported: if torch_npu is installed but the
CANN libraries are missing, torch's automatic loading of backend extensions
would make every ``import torch`` in the kernel fail, so nbdist turns that
loading off and falls back to another backend, saying why.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Choice:
    """The backend and device chosen for this rank, and why."""

    backend: str
    device: str
    reason: str


def _npu_status() -> tuple[bool, str]:
    """(usable, explanation) for NPUs, decided without importing torch or torch_npu."""
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    for lib in ("libhccl.so", "libascend_hal.so"):
        try:
            ctypes.CDLL(lib)
        except OSError:
            return False, f"torch_npu is installed but the CANN library {lib} was not found"
    return True, "torch_npu and the CANN libraries are present"


def _guard_torch_import(npu_usable: bool) -> None:
    """Keep a broken torch_npu from breaking ``import torch`` (only before torch loads)."""
    if not npu_usable and "torch" not in sys.modules:
        if importlib.util.find_spec("torch_npu") is not None:
            os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def choose(backend: str, device: str | None, local_rank: int) -> Choice:
    """Pick the backend (``auto`` = hccl, nccl, gloo in that order) and the device."""
    npu_usable, npu_why = _npu_status()
    _guard_torch_import(npu_usable)
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
    return Choice(backend, device, reason)


def activate(choice: Choice):
    """Make the chosen device current; returns it as a ``torch.device``."""
    import torch

    dev = torch.device(choice.device)
    if dev.type == "npu":
        import torch_npu  # noqa: F401  (registers the npu device type)

        torch.npu.set_device(dev)
    elif dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev
