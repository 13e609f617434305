"""Fixtures: real kernels through jupyter_client, real TCP on free loopback ports."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from nbdist import kernels, netinfo


def free_port() -> int:
    """A free loopback port below the ephemeral range, so sockets opened later cannot take it."""
    port = netinfo.first_free_port(secrets.randbelow(10_000) + 20_000 for _ in range(200))
    if port is None:
        raise RuntimeError("no free port in 20000-29999")
    return port


@pytest.fixture
def port() -> int:
    return free_port()


def init_line(rank: int, world_size: int, port: int, extra: str = "") -> str:
    return f"%%dist_init --rank {rank} --world-size {world_size} --master-addr 127.0.0.1 --master-port {port} {extra}"


@pytest.fixture
def start_kernels() -> Iterator[Callable[[int], list[kernels.Kernel]]]:
    """Factory: start N kernels with nbdist loaded; all are shut down after the test."""
    started: list[kernels.Kernel] = []

    def factory(n: int) -> list[kernels.Kernel]:
        ks = kernels.start(n)
        started.extend(ks)
        for r in kernels.execute_all(ks, "%load_ext nbdist", timeout=60):
            assert r.status == "ok", r.error
        return ks

    yield factory
    for k in reversed(started):  # rank 0 hosts the server: stop it last
        k.shutdown()


@pytest.fixture
def make_world(start_kernels, port) -> Callable[[int], list[kernels.Kernel]]:
    """Factory: N kernels that have formed a world on a free port."""

    def factory(n: int) -> list[kernels.Kernel]:
        ks = start_kernels(n)
        results = kernels.execute_all(ks, [init_line(i, n, port) for i in range(n)], timeout=120)
        for i, r in enumerate(results):
            assert r.status == "ok", f"rank {i}: {r.error}"
        return ks

    return factory


@pytest.fixture
def record_fault(request) -> Callable[[str, float], None]:
    """Record a measured time-to-error (seconds) in pytest's cache, for the README's fault table."""

    def record(name: str, seconds: float) -> None:
        request.config.cache.set(f"nbdist/fault/{name}", round(seconds, 2))

    return record


def run_in_background(kernel: kernels.Kernel, code: str, timeout: float = 120) -> tuple[threading.Thread, dict]:
    """Start a cell without waiting; its Result lands in ``box["r"]`` and its end time in ``box["t"]``."""
    box: dict = {}

    def target() -> None:
        try:
            box["r"] = kernel.execute(code, timeout=timeout)
        except Exception as exc:  # a kernel that was killed on purpose never replies
            box["exc"] = exc
        box["t"] = time.monotonic()

    t = threading.Thread(target=target, daemon=True)  # never keeps pytest from exiting
    t.start()
    return t, box
