"""Environment plans: which variables each backend needs on this rank, and why.

:func:`plan` is pure: from the backend, the route to the master and the
current environment it returns the variables to set. Values already in the
environment are the user's and win; ``--env KEY=VALUE`` overrides both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..config import TIMEOUTS, debug_mode
from ..errors import ConfigError
from ..ranksets import who_said
from ..world.netinfo import Route
from . import ascend, hcclports
from .ascend import A1, NEW_ERROR_VAR, OLD_ERROR_VAR

# Values that must be the same on every rank; compared at join. TORCH_DISTRIBUTED_DEBUG=DETAIL on one rank
# only makes that rank wait for a wrapper group the others never make (measured on gloo: it hangs until the timeout).
AGREED = ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_BUFFSIZE", "TORCH_DISTRIBUTED_DEBUG")

HCCL_CONNECT_TIMEOUT = 600  # CANN's 120 s is too short for people starting notebooks by hand
HCCL_EXEC_TIMEOUT = 300  # CANN's 1836 s is a long wait in a notebook
PG_TIMEOUT = TIMEOUTS["process_group"]  # torch's 30 minutes is far too long for interactive use
_PG_MARGIN = 60.0  # the process-group timeout stays this far above HCCL's own timeouts
EXEC_TIMEOUT_MAX = 2147483647  # Atlas A2/A3 (CANN envref_07_0078)
EXEC_TIMEOUT_MAX_A1 = 17340  # first-generation Atlas training, in steps of 68 s (envref_07_0078)

# torch_npu's async error handling (ProcessGroupHCCL.hpp:200-206, the same enum as NCCL's):
# 0 no handling, 1 tear the process down (the default: OptionsManager.cpp:226), 2 "just clean up
# collectives and abort communicators without tearing down process", 3 tear down without cleaning up.
# Only 1 and 3 rethrow in the watchdog and so kill the kernel (SHOULD_TEAR_DOWN, ProcessGroupHCCL.cpp:983-997
# and 2046-2050); with 2 the failed work keeps its exception, which reaches the cell that waits on it.
ERROR_HANDLING = "2"
ERROR_VARS = (NEW_ERROR_VAR, OLD_ERROR_VAR)

# Known before the master is: set at %load_ext, before torch_npu can read them.
EARLY = ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_WHITELIST_DISABLE", *ERROR_VARS)
# Read once per process by torch_npu, at its first HCCL process group or first collective
# (OptionsManager.cpp:215-234 keeps the error handling in a function-local static on the 2.13 line;
# ProcessGroupHCCL.cpp:959 and the call_once at :1146 keep HCCL_EXEC_TIMEOUT).
READ_ONCE = ("HCCL_EXEC_TIMEOUT", *ERROR_VARS)


@dataclass(frozen=True)
class EnvVar:
    """One variable of a plan. ``value`` None means: left unset, shown for information."""

    key: str
    value: str | None
    why: str
    source: str = "nbdist"  # "nbdist", "your environment", "--env", "default"
    warning: str = ""  # something the user should know about this value (shown in the init summary)


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


def _hccl_common(npu: ascend.Facts) -> list[EnvVar]:
    """The HCCL variables that do not depend on where the master is."""
    exec_why = "wait for peers during a collective, lowered for notebooks (CANN default 1836 s)"
    if npu.family == A1:
        exec_why += f"; on {A1} HCCL uses {HCCL_EXEC_TIMEOUT // 68 * 68} s (a multiple of 68 s)"
    wanted = [
        EnvVar("HCCL_CONNECT_TIMEOUT", str(HCCL_CONNECT_TIMEOUT),
               "link set-up wait raised for humans (CANN default 120 s); must agree on every rank"),
        EnvVar("HCCL_EXEC_TIMEOUT", str(HCCL_EXEC_TIMEOUT), exec_why),
        EnvVar("HCCL_WHITELIST_DISABLE", "1", "no IP whitelist between the notebooks"),
    ]
    for key in npu.error_var:
        wanted.append(EnvVar(key, ERROR_HANDLING, "on a failed or timed-out collective, abort the communicators and "
                             "raise in the cell, not take the kernel down (torch_npu's default 1 does); "
                             + npu.error_var_why))
    return wanted


def _wanted(backend: str, route: Route, debug: str, npu: ascend.Facts) -> list[EnvVar]:
    where = f"{route.interface or '?'} ({route.local_ip})"
    if backend == "hccl":
        ip_why = (
            "this host is the master: HCCL listens on the master's own address"
            if route.master_is_local
            else f"the address of the interface that routes to the master {route.master_ip}: {where}"
        )
        wanted = [
            EnvVar("HCCL_IF_IP", route.master_ip if route.master_is_local else route.local_ip, ip_why),
            *_hccl_common(npu),
            EnvVar("HCCL_IF_BASE_PORT", None,
                   "not set: rank 0's host listens on ports 60000-60031 (CANN 8.3 and later; 60000-60015 before) "
                   "for the other hosts; the NPUs' own network cards must reach each other on 16666 (RoCE)",
                   "default"),
        ]
    elif backend == "nccl":
        wanted = [
            EnvVar("NCCL_SOCKET_IFNAME", route.interface, f"the interface that routes to the master: {where}"),
            EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2",
                   "on a failed collective, abort the communicator and raise in the cell (not kill the kernel)"),
        ]
    elif backend == "gloo":
        wanted = [
            EnvVar("GLOO_SOCKET_IFNAME", route.interface,
                   f"the interface that routes to the master: {where} (else gloo advertises whatever the "
                   "hostname resolves to, often 127.0.0.1)"),
        ]
    else:
        raise ConfigError(f"no environment plan for backend {backend!r}")
    if debug:
        wanted += debug_variables(backend, debug)
    return wanted


def debug_variables(backend: str, debug: str, flag: str = "--debug") -> list[EnvVar]:
    """The diagnostics ``flag`` turns on for ``backend`` (``debug``: "files" or "stdout", see config.debug_mode)."""
    wanted = []
    if backend == "hccl":
        wanted += [
            EnvVar("HCCL_ENTRY_LOG_ENABLE", "1", f"{flag}: log every HCCL call"),
            EnvVar("ASCEND_GLOBAL_LOG_LEVEL", "1", f"{flag}: CANN log level INFO"),
        ]
        if debug == "stdout":
            wanted.append(EnvVar("ASCEND_SLOG_PRINT_TO_STDOUT", "1",
                                 f"{flag} stdout: CANN prints its logs here and writes no log files "
                                 "(CANN envref_07_0121), which HCCL's troubleshooting guides ask for"))
        else:
            wanted.append(EnvVar("ASCEND_SLOG_PRINT_TO_STDOUT", None,
                                 "not set: CANN keeps writing its log files (~/ascend/log), which HCCL's "
                                 "troubleshooting guides ask for; --debug stdout prints them here instead, "
                                 "and then no files are written", "default"))
    elif backend == "nccl":
        wanted.append(EnvVar("NCCL_DEBUG", "INFO", f"{flag}: NCCL diagnostics"))
    wanted.append(EnvVar("TORCH_DISTRIBUTED_DEBUG", "DETAIL", f"{flag}: torch.distributed checks and logs"))
    return wanted


def plan(
    backend: str,
    route: Route,
    environ: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
    debug: object = False,
    npu: ascend.Facts | None = None,
) -> list[EnvVar]:
    """The variables to set for ``backend`` on this rank, each with its reason and source."""
    npu = ascend.Facts() if npu is None else npu
    return _settle(_wanted(backend, route, debug_mode(debug), npu), environ, overrides, npu, backend)


def early(environ: Mapping[str, str], npu: ascend.Facts) -> list[EnvVar]:
    """The HCCL variables that can be set at ``%load_ext``, before the master is known or torch_npu is loaded."""
    return _settle(_hccl_common(npu), environ, None, npu, "hccl")


def _settle(wanted: list[EnvVar], environ: Mapping[str, str], overrides: Mapping[str, str] | None,
            npu: ascend.Facts, backend: str) -> list[EnvVar]:
    overrides = dict(overrides or {})
    result = []
    for var in wanted:
        if var.key in overrides:
            var = EnvVar(var.key, overrides.pop(var.key), "set with --env", "--env")
        elif environ.get(var.key, "") != "":
            var = EnvVar(var.key, environ[var.key], "already set: yours wins", "your environment")
        result.append(var)
    result += [EnvVar(k, v, "set with --env", "--env") for k, v in overrides.items()]
    if backend == "hccl":
        result = _one_error_handling(result, npu)
    validate(result, npu)
    return [_warn_error_mode(v) for v in result]


_MODES = {"0": "makes torch_npu ignore failed collectives: a stuck one is never aborted",
          "1": "makes torch_npu take the whole kernel down on a failed or timed-out collective",
          "3": "makes torch_npu take the whole kernel down on a failed or timed-out collective"}


def _warn_error_mode(var: EnvVar) -> EnvVar:
    if var.key in ERROR_VARS and var.value in _MODES and not var.warning:
        return replace(var, warning=f"{var.key}={var.value} {_MODES[var.value]}; nbdist's default "
                                    f"{ERROR_HANDLING} aborts the communicators and raises in the cell")
    return var


def _one_error_handling(variables: list[EnvVar], npu: ascend.Facts) -> list[EnvVar]:
    """Either name of the error-handling variable is accepted; the one this torch_npu reads gets the value.

    A value the user gave under the other name is carried over to it, with a warning only when that name
    is not the one this torch_npu reads.
    """
    read = npu.error_var
    theirs = [v for v in variables if v.key in ERROR_VARS and v.source != "nbdist"]
    if not theirs:
        return variables
    given = theirs[0]
    out = []
    for var in variables:
        if var.key in read and var.source == "nbdist":
            var = replace(var, value=given.value, source=given.source,
                          why=f"{given.why} (as {given.key}); {npu.error_var_why}")
        elif var.key == given.key and given.key not in read:
            var = replace(var, warning=f"{given.key} is not the name torch_npu {npu.torch_npu} reads "
                                       f"({npu.error_var_why}): nbdist sets {'/'.join(read)}={given.value} too")
        out.append(var)
    return out


def validate(variables: Sequence[EnvVar], npu: ascend.Facts | None = None) -> None:
    """Check the values nbdist knows the valid ranges of (per product family where that matters)."""
    npu = ascend.Facts() if npu is None else npu
    values = {v.key: v.value for v in variables if v.value is not None}
    if "HCCL_CONNECT_TIMEOUT" in values:
        _int_in("HCCL_CONNECT_TIMEOUT", values["HCCL_CONNECT_TIMEOUT"], 120, 7200)
    if "HCCL_EXEC_TIMEOUT" in values:
        _exec_timeout(values["HCCL_EXEC_TIMEOUT"], npu.family)
    if "HCCL_IF_BASE_PORT" in values:
        _int_in("HCCL_IF_BASE_PORT", values["HCCL_IF_BASE_PORT"], 1024, 65520)
    for key in (hcclports.HOST_RANGE_VAR, hcclports.NPU_RANGE_VAR):
        if key in values and values[key].strip() != "auto":
            try:
                hcclports.parse_range(values[key])
            except ValueError as exc:
                raise ConfigError(f"{key}: {exc}; it takes {hcclports.FORMS}") from None
    for key in ERROR_VARS:
        if key in values:
            _int_in(key, values[key], 0, 3)  # torch_npu refuses anything else (OptionsManager.cpp:228-230)


def _exec_timeout(value: str, family: str | None) -> int:
    """HCCL_EXEC_TIMEOUT by product family (CANN envref_07_0078); 0 ("never") is refused for notebooks."""
    high = EXEC_TIMEOUT_MAX_A1 if family == A1 else EXEC_TIMEOUT_MAX  # unknown: the Atlas A2/A3 range
    if value.strip() == "0":
        raise ConfigError("HCCL_EXEC_TIMEOUT=0 means a stuck collective never ends on the NPU, and nothing else can "
                          "end it there (nbdist aborts the communicators, but an operation already on the device "
                          f"runs on): choose a number of seconds, e.g. 300 (at most {high})")
    return _int_in("HCCL_EXEC_TIMEOUT", value, 1, high)


def _int_in(key: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{key} must be an integer, not {value!r}") from None
    if not low <= number <= high:
        raise ConfigError(f"{key} must be in {low}..{high}, not {number}")
    return number


def process_group_timeout(backend: str, variables: Sequence[EnvVar], requested: float | None = None) -> float:
    """The process-group timeout: interactive by default; for hccl above HCCL_CONNECT_TIMEOUT and HCCL_EXEC_TIMEOUT.

    torch_npu recommends that the group's timeout exceed both (Ascend/pytorch v26.2.0-beta.1-pytorch2.13.0,
    docs/zh/api/environment_variable/collective_communication/TORCH_HCCL_ASYNC_ERROR_HANDLING.md:34).
    """
    timeout = PG_TIMEOUT if requested is None else requested
    if backend != "hccl":
        return timeout
    values = {v.key: v.value for v in variables if v.value}
    limits = {key: int(values[key]) for key in ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT") if key in values}
    if not limits:
        return timeout
    key, highest = max(limits.items(), key=lambda item: item[1])
    floor = highest + _PG_MARGIN
    if requested is not None and requested < floor:
        raise ConfigError(
            f"--pg-timeout {requested:g} must stay above {key} ({highest} s) by {_PG_MARGIN:g} s, as torch_npu "
            f"recommends for HCCL_CONNECT_TIMEOUT and HCCL_EXEC_TIMEOUT: use at least {floor:g}"
        )
    return max(timeout, floor)


def stale(variables: Sequence[EnvVar], seen: Mapping[str, str | None] | None) -> list[str]:
    """The planned values torch_npu will not see: it read ``seen`` once, earlier in this process."""
    if seen is None:
        return []
    return [f"{v.key}={v.value} (torch_npu keeps {seen.get(v.key) or 'its default'})"
            for v in variables if v.key in READ_ONCE and v.value is not None and v.value != seen.get(v.key)]


def agreed_values(backend: str, variables: Sequence[EnvVar], npu: ascend.Facts | None = None) -> dict[str, str]:
    """What must match on every rank: the backend, a few HCCL values, and for hccl the CANN and torch_npu versions.

    Ranks on different CANN versions fail when HCCL sets up its links (error EI0008, CANN hcclug_000045).
    """
    values = {"backend": backend}
    values.update({v.key: v.value for v in variables if v.key in AGREED and v.value is not None})
    if backend == "hccl" and npu is not None:
        values["CANN version"] = npu.cann or "unknown"
        values["torch_npu version"] = npu.torch_npu or "unknown"
    return values


def disagreements(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """Human-readable mismatches of ``agreed`` values between ranks' registrations."""
    keys = sorted({k for r in ranks for k in (r.get("agreed") or {})})
    problems = []
    for key in keys:
        seen: dict[str, list[int]] = {}
        for i, r in enumerate(ranks):
            seen.setdefault(str((r.get("agreed") or {}).get(key, "(unset)")), []).append(i)
        if len(seen) > 1:
            problems.append(f"{key} differs between ranks ({who_said(seen)})")
    return problems


def as_shell(variables: Sequence[EnvVar]) -> str:
    """The plan as shell-sourceable ``KEY=VALUE`` lines with the reasons as comments."""
    lines = []
    for v in variables:
        lines.append(f"# {v.why} [{v.source}]")
        if v.warning:
            lines.append(f"# warning: {v.warning}")
        lines.append(f"{v.key}={_quote(v.value)}" if v.value is not None else f"# {v.key} (unset)")
    return "\n".join(lines)


def _quote(value: str) -> str:
    import shlex

    return shlex.quote(value)
