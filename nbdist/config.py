"""Defaults in one place, and the resolution of a world's configuration.

A value comes from, in order: a magic flag, the values ``nbdist run`` gives the
copy it runs (``NBDIST_RUN``, a JSON object: they beat the notebook's own
configuration area, so that a notebook written for port 29500 runs on a free
one in CI), a variable of the same name in the notebook's namespace (the
walkthrough's "configuration area"), then the environment variable of that name.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .errors import ConfigError

DEFAULT_PORT = 29500
BACKENDS = ("auto", "gloo", "nccl", "hccl")

# Named timeouts, seconds. Every wait in nbdist takes one of these.
TIMEOUTS = {
    "join": 600.0,  # ranks may arrive minutes apart
    "barrier": 300.0,  # a %%collective barrier
    "connect": 30.0,  # reaching the rendezvous server once it listens
    "process_group": 300.0,  # torch's own timeout for collectives
}
for _name, _value in TIMEOUTS.items():
    assert _value > 0, _name

HEARTBEAT_INTERVAL = 1.0  # seconds between a rank's heartbeats
POLL_INTERVAL = 0.1  # longest uninterruptible slice of any wait
MAX_FIELD_CHARS = 64 * 1024  # per captured stream, per rank, before truncation
MAX_VALUE_BYTES = 4 * 1024 * 1024  # the store refuses values over 8 MiB

# Names looked up in the namespace and in the environment, per setting.
_SOURCES = {
    "rank": "RANK",
    "world_size": "WORLD_SIZE",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
    "device": "DEVICE_ID",
    "backend": "BACKEND",
    "token": "NBDIST_TOKEN",
}


@dataclass(frozen=True)
class WorldConfig:
    """What a rank needs to join a world: validated, ready to use."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int = DEFAULT_PORT
    backend: str = "auto"
    device: str | None = None
    timeout: float = TIMEOUTS["join"]
    env: dict[str, str] = field(default_factory=dict)  # --env KEY=VALUE overrides
    debug: str = ""  # "", "files" or "stdout" (see debug_mode below)
    pg_timeout: float | None = None
    token: str | None = field(default=None, repr=False)
    sources: dict[str, str] = field(default_factory=dict, compare=False)  # setting -> where its value came from


def env_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings nbdist reads from environment variables (the only place it does)."""
    environ = os.environ if environ is None else environ
    return {key: environ[var] for key, var in _SOURCES.items() if environ.get(var, "") != ""}


RUN_VARIABLE = "NBDIST_RUN"  # set by ``nbdist run`` in the kernels it starts
WORKER_VARIABLE = "NBDIST_WORKER"  # "1" in the worker kernels that %dist_init --spawn starts (nbdist.drive.workers)


def spawned(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this kernel is a worker that a driving notebook started (and starts again if it dies)."""
    environ = os.environ if environ is None else environ
    return environ.get(WORKER_VARIABLE, "") == "1"
RUN_SETTINGS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_settings(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """What ``nbdist run`` decided for this copy of a notebook (rank, world size, master): empty outside it."""
    environ = os.environ if environ is None else environ
    raw = environ.get(RUN_VARIABLE, "")
    if not raw:
        return {}
    try:
        values = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{RUN_VARIABLE} is not JSON: {raw[:80]!r}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{RUN_VARIABLE} must be a JSON object, not {raw[:80]!r}")
    return {key: values[key] for key in RUN_SETTINGS if values.get(key) is not None}


FUZZ_VARIABLE = "NBDIST_STORE_FUZZ"  # schedule fuzzing at the store's choke point, for soaks (off when unset)


@dataclass(frozen=True)
class StoreFuzz:
    """Seeded delays at the store's choke point: each chance is taken with ``probability``, for 0..``max_ms`` ms."""

    seed: int
    probability: float = 0.35
    max_ms: float = 50.0

    @property
    def spec(self) -> str:
        """In the form ``NBDIST_STORE_FUZZ`` and ``soak.py --fuzz`` take (``7:0.35:50``)."""
        return f"{self.seed}:{self.probability:g}:{self.max_ms:g}"


def store_fuzz(environ: Mapping[str, str] | None = None) -> StoreFuzz | None:
    """``NBDIST_STORE_FUZZ``, parsed: None when unset or empty; a malformed value raises :class:`ConfigError`."""
    environ = os.environ if environ is None else environ
    return parse_store_fuzz(environ.get(FUZZ_VARIABLE, ""))


def parse_store_fuzz(text: str, name: str = FUZZ_VARIABLE) -> StoreFuzz | None:
    """``SEED`` or ``SEED:PROBABILITY:MAX_MS`` as a :class:`StoreFuzz` (None for ""); ``name`` is what errors cite."""
    raw = text.strip()
    if not raw:
        return None
    bad = ConfigError(
        f"{name} must be SEED or SEED:PROBABILITY:MAX_MS (e.g. 7 or 7:0.35:50; PROBABILITY in 0..1, MAX_MS >= 0), "
        f"not {raw!r}"
    )
    parts = raw.split(":")
    if len(parts) not in (1, 3):
        raise bad
    try:
        fuzz = StoreFuzz(int(parts[0]), *(float(part) for part in parts[1:]))
    except ValueError:
        raise bad from None
    if not (0.0 <= fuzz.probability <= 1.0 and 0.0 <= fuzz.max_ms < float("inf")):  # also refuses nan
        raise bad
    return fuzz


def resolve(
    flags: Mapping[str, object],
    namespace: Mapping[str, object],
    environ: Mapping[str, str] | None = None,
) -> WorldConfig:
    """Merge flags, notebook variables and environment into a validated config."""
    envs = env_settings(environ)
    runner = run_settings(environ)
    merged: dict[str, object] = {}
    sources: dict[str, str] = {}
    for key, var in _SOURCES.items():
        if flags.get(key) is not None:
            merged[key], sources[key] = flags[key], f"--{key.replace('_', '-')}"
        elif var in runner:
            merged[key], sources[key] = runner[var], "nbdist run"
        elif namespace.get(var) is not None:
            merged[key], sources[key] = namespace[var], f"{var} in the notebook"
        elif key in envs:
            merged[key], sources[key] = envs[key], f"{var} in the environment"
    timeout = flags.get("timeout")
    cfg = validate(
        rank=merged.get("rank"),
        world_size=merged.get("world_size"),
        master_addr=merged.get("master_addr"),
        master_port=merged.get("master_port", DEFAULT_PORT),
        backend=merged.get("backend", "auto"),
        device=merged.get("device"),
        timeout=TIMEOUTS["join"] if timeout is None else timeout,
        env=flags.get("env") or {},
        debug=flags.get("debug") or "",
        pg_timeout=flags.get("pg_timeout"),
        token=merged.get("token"),
    )
    return replace(cfg, sources=sources)


def describe_sources(cfg: WorldConfig) -> str:
    """Where this notebook's settings came from, in one line (the init summary shows it)."""
    shown = [("rank", cfg.rank), ("world_size", cfg.world_size), ("master_addr", cfg.master_addr),
             ("master_port", cfg.master_port), ("backend", cfg.backend)]
    parts = [f"{key.replace('_', ' ')} {value} ({cfg.sources.get(key, 'default')})" for key, value in shown]
    if cfg.token:
        parts.append(f"token ({cfg.sources.get('token', '?')})")
    return "this notebook's settings: " + ", ".join(parts)


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {value!r}") from None


def validate(
    *,
    rank: object,
    world_size: object,
    master_addr: object,
    master_port: object = DEFAULT_PORT,
    backend: object = "auto",
    device: object = None,
    timeout: object = TIMEOUTS["join"],
    env: object = None,
    debug: object = False,
    pg_timeout: object = None,
    token: object = None,
) -> WorldConfig:
    """Check every value and say which flag to fix; returns a :class:`WorldConfig`."""
    if world_size is None:
        raise ConfigError("the world size is missing: pass --world-size N (or set WORLD_SIZE)")
    if rank is None:
        raise ConfigError("this notebook's rank is missing: pass --rank R (or set RANK)")
    size = _as_int("--world-size", world_size)
    if size < 1:
        raise ConfigError(f"--world-size must be at least 1, not {size}")
    rank_ = _as_int("--rank", rank)
    if not 0 <= rank_ < size:
        raise ConfigError(f"--rank must be in 0..{size - 1} for a world of {size}, not {rank_}")
    if master_addr is None or str(master_addr).strip() == "":
        raise ConfigError(
            "the master address is missing: pass --master-addr ADDR (rank 0's address, "
            "127.0.0.1 when all notebooks run on one machine)"
        )
    port = _as_int("--master-port", master_port)
    if not 1 <= port <= 65535:
        raise ConfigError(f"--master-port must be in 1..65535, not {port}")
    backend_ = str(backend).strip().lower()
    if backend_ not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    timeout_ = positive_seconds("--timeout", timeout)
    device_ = None if device is None else str(device).strip()
    pg_timeout_ = None if pg_timeout is None else positive_seconds("--pg-timeout", pg_timeout)
    return WorldConfig(
        rank=rank_,
        world_size=size,
        master_addr=str(master_addr).strip(),
        master_port=port,
        backend=backend_,
        device=device_ or None,
        timeout=timeout_,
        env=dict(env or {}),  # type: ignore[call-overload]
        debug=debug_mode(debug),
        pg_timeout=pg_timeout_,
        token=None if token in (None, "") else str(token),
    )


def debug_mode(debug: object) -> str:
    """``--debug`` as a mode: "" (off), "files" (CANN keeps its log files) or "stdout"."""
    if debug in (None, False, ""):
        return ""
    if debug is True:
        return "files"
    mode = str(debug).strip().lower()
    if mode not in ("files", "stdout"):
        raise ConfigError(f"--debug takes files (the default) or stdout, not {debug!r}")
    return mode


def positive_seconds(name: str, value: object) -> float:
    """Parse a timeout flag: a positive number of seconds."""
    try:
        seconds = float(str(value))
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {value!r}") from None
    if not seconds > 0:
        raise ConfigError(f"{name} must be positive, not {seconds:g}")
    return seconds


def is_local_address(host: str) -> bool:
    """Whether ``host`` names this machine (so a server for it can be bound here)."""
    try:
        addrs = {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except socket.gaierror:
        return False
    for addr in addrs:
        try:
            if ipaddress.ip_address(addr).is_loopback:
                return True
        except ValueError:
            continue
        probe = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
        try:
            probe.bind((addr, 0))
            return True
        except OSError:
            continue
        finally:
            probe.close()
    return False
