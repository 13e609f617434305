"""Environment plans: which variables each backend needs on this rank, and why.

:func:`plan` is pure: from the backend, the route to the master and the
current environment it returns the variables to set. Values already in the
environment are the user's and win; ``--env KEY=VALUE`` overrides both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .config import TIMEOUTS
from .errors import ConfigError
from .netinfo import Route

# Values that must be the same on every rank; compared at join.
AGREED = ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_BUFFSIZE")

HCCL_CONNECT_TIMEOUT = 600  # CANN's 120 s is too short for people starting notebooks by hand
HCCL_EXEC_TIMEOUT = 300  # CANN's 1836 s is a long wait in a notebook
PG_TIMEOUT = TIMEOUTS["process_group"]  # torch's 30 minutes is far too long for interactive use
_PG_MARGIN = 60.0  # the process-group timeout stays this far above HCCL_EXEC_TIMEOUT

DEPRECATED = {"HCCL_ASYNC_ERROR_HANDLING": "TORCH_HCCL_ASYNC_ERROR_HANDLING"}


@dataclass(frozen=True)
class EnvVar:
    """One variable of a plan. ``value`` None means: left unset, shown for information."""

    key: str
    value: str | None
    why: str
    source: str = "nbdist"  # "nbdist", "your environment", "--env", "default"


def parse_overrides(items: Sequence[str] | None) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` from repeated ``--env`` flags."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not key.replace("_", "").isalnum():
            raise ConfigError(f"--env takes KEY=VALUE, not {item!r}")
        out[key] = value
    return out


def _wanted(backend: str, route: Route, debug: bool) -> list[EnvVar]:
    where = f"{route.interface or '?'} ({route.local_ip})"
    if backend == "hccl":
        ip_why = (
            "this host is the master: HCCL listens on the master's own address"
            if route.master_is_local
            else f"the address of the interface that routes to the master {route.master_ip}: {where}"
        )
        wanted = [
            EnvVar("HCCL_IF_IP", route.master_ip if route.master_is_local else route.local_ip, ip_why),
            EnvVar("HCCL_CONNECT_TIMEOUT", str(HCCL_CONNECT_TIMEOUT),
                   "link set-up wait raised for humans (CANN default 120 s); must agree on every rank"),
            EnvVar("HCCL_EXEC_TIMEOUT", str(HCCL_EXEC_TIMEOUT),
                   "wait for peers during a collective, lowered for notebooks (CANN default 1836 s)"),
            EnvVar("HCCL_WHITELIST_DISABLE", "1", "no IP whitelist between the notebooks"),
            EnvVar("HCCL_IF_BASE_PORT", None,
                   "not set: rank 0's host listens from port 60000 (CANN default); open 60000-60031 and 16666",
                   "default"),
        ]
        if debug:
            wanted += [
                EnvVar("HCCL_ENTRY_LOG_ENABLE", "1", "--debug: log every HCCL call"),
                EnvVar("ASCEND_GLOBAL_LOG_LEVEL", "1", "--debug: CANN log level INFO"),
                EnvVar("ASCEND_SLOG_PRINT_TO_STDOUT", "1", "--debug: CANN logs to stdout"),
            ]
    elif backend == "nccl":
        wanted = [
            EnvVar("NCCL_SOCKET_IFNAME", route.interface, f"the interface that routes to the master: {where}"),
            EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2",
                   "on a failed collective, abort the communicator and raise in the cell (not kill the kernel)"),
        ]
        if debug:
            wanted.append(EnvVar("NCCL_DEBUG", "INFO", "--debug: NCCL diagnostics"))
    elif backend == "gloo":
        wanted = [
            EnvVar("GLOO_SOCKET_IFNAME", route.interface,
                   f"the interface that routes to the master: {where} (else gloo advertises whatever the "
                   "hostname resolves to, often 127.0.0.1)"),
        ]
    else:
        raise ConfigError(f"no environment plan for backend {backend!r}")
    if debug:
        wanted.append(EnvVar("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "--debug: torch.distributed checks and logs"))
    return wanted


def plan(
    backend: str,
    route: Route,
    environ: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
    debug: bool = False,
) -> list[EnvVar]:
    """The variables to set for ``backend`` on this rank, each with its reason and source."""
    overrides = dict(overrides or {})
    for old, new in DEPRECATED.items():
        if old in overrides:
            raise ConfigError(f"{old} is deprecated: use {new}")
    result = []
    for var in _wanted(backend, route, debug):
        if var.key in overrides:
            var = EnvVar(var.key, overrides.pop(var.key), "set with --env", "--env")
        elif environ.get(var.key, "") != "":
            var = EnvVar(var.key, environ[var.key], "already set: yours wins", "your environment")
        result.append(var)
    result += [EnvVar(k, v, "set with --env", "--env") for k, v in overrides.items()]
    validate(result)
    return result


def validate(variables: Sequence[EnvVar]) -> None:
    """Check the values nbdist knows the valid ranges of."""
    values = {v.key: v.value for v in variables if v.value is not None}
    if "HCCL_CONNECT_TIMEOUT" in values:
        _int_in("HCCL_CONNECT_TIMEOUT", values["HCCL_CONNECT_TIMEOUT"], 120, 7200)
    if "HCCL_EXEC_TIMEOUT" in values:
        _int_in("HCCL_EXEC_TIMEOUT", values["HCCL_EXEC_TIMEOUT"], 0, 17340)
    if "HCCL_IF_BASE_PORT" in values:
        _int_in("HCCL_IF_BASE_PORT", values["HCCL_IF_BASE_PORT"], 1024, 65520)


def _int_in(key: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{key} must be an integer, not {value!r}") from None
    if not low <= number <= high:
        raise ConfigError(f"{key} must be in {low}..{high}, not {number}")
    return number


def process_group_timeout(backend: str, variables: Sequence[EnvVar], requested: float | None = None) -> float:
    """The process-group timeout: interactive by default, above HCCL_EXEC_TIMEOUT for hccl."""
    timeout = PG_TIMEOUT if requested is None else requested
    if backend == "hccl":
        exec_timeout = next((int(v.value) for v in variables if v.key == "HCCL_EXEC_TIMEOUT" and v.value), None)
        if exec_timeout:
            floor = exec_timeout + _PG_MARGIN
            if requested is not None and requested < floor:
                raise ConfigError(
                    f"--pg-timeout {requested:g} must stay above HCCL_EXEC_TIMEOUT ({exec_timeout} s) "
                    f"by {_PG_MARGIN:g} s: use at least {floor:g}"
                )
            timeout = max(timeout, floor)
    return timeout


def agreed_values(backend: str, variables: Sequence[EnvVar]) -> dict[str, str]:
    """What must match on every rank: the backend and a few HCCL values."""
    values = {"backend": backend}
    values.update({v.key: v.value for v in variables if v.key in AGREED and v.value is not None})
    return values


def disagreements(ranks: Sequence[Mapping[str, object]]) -> list[str]:
    """Human-readable mismatches of ``agreed`` values between ranks' registrations."""
    keys = sorted({k for r in ranks for k in (r.get("agreed") or {})})
    problems = []
    for key in keys:
        seen: dict[str, list[int]] = {}
        for i, r in enumerate(ranks):
            seen.setdefault(str((r.get("agreed") or {}).get(key, "(unset)")), []).append(i)
        if len(seen) > 1:
            parts = "; ".join(f"rank(s) {', '.join(map(str, who))}: {value}" for value, who in seen.items())
            problems.append(f"{key} differs between ranks ({parts})")
    return problems


def as_shell(variables: Sequence[EnvVar]) -> str:
    """The plan as shell-sourceable ``KEY=VALUE`` lines with the reasons as comments."""
    lines = []
    for v in variables:
        lines.append(f"# {v.why} [{v.source}]")
        lines.append(f"{v.key}={_quote(v.value)}" if v.value is not None else f"# {v.key} (unset)")
    return "\n".join(lines)


def _quote(value: str) -> str:
    import shlex

    return shlex.quote(value)
