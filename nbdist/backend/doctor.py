"""``%dist_doctor`` / ``nbdist doctor``: quick checks of what a world across hosts needs.

Each check is one line: pass, warn or fail, and the fix. Every probe has a
short timeout, so the whole run takes seconds and never hangs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from ..config import DEFAULT_PORT, WorldConfig, env_settings, validate
from ..errors import ConfigError, NbdistError, NotNbdistServerError, TokenError
from ..world import netinfo
from ..world.store import connect, probe, run_in_thread
from . import hcclports

PROBE_TIMEOUT = 2.0
SERVER_TIMEOUT = 2.0  # seconds the handshake with what answers on the master port may take
HCCN_TOOL_DIR = "/usr/local/Ascend/driver/tools"  # where the Ascend driver installs hccn_tool


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "warn", "FAIL", "info"
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        fix = f" → {self.fix}" if self.fix else ""
        return f"[{self.status:^4}] {self.name}: {self.detail}{fix}"


def _server_check(host: str, port: int, local: bool, token: str | None = None, token_source: str = "--token") -> Check:
    """What answers at host:port; for an nbdist server, whether ``token`` is the one it requires (never shown)."""
    name = f"TCP to {host}:{port}"
    state = probe(host, port, PROBE_TIMEOUT)
    if state == "open":
        return _nbdist_server_check(name, host, port, token, token_source)
    if state == "refused":
        if local:
            return Check(name, "ok", "nothing listens yet; rank 0's %%dist_init will start the server here")
        return Check(name, "FAIL", "connection refused: nothing listens there",
                     "run %%dist_init in rank 0's notebook first (it starts the server), or `nbdist serve` there; "
                     "check --master-addr and --master-port")
    if state == "timeout":
        return Check(name, "FAIL", f"no answer within {PROBE_TIMEOUT:g} s: a firewall or security group drops it",
                     f"open TCP port {port} on the master's host to this host")
    return Check(name, "FAIL", "no route to the master", "check --master-addr and this host's network")


def _ask(host: str, port: int, token: str | None) -> dict[str, Any]:
    """The server's marker, through the same handshake and token check as %%dist_init's."""
    import torch.distributed  # noqa: F401  # first import can take seconds: not under the deadline below

    def ask() -> dict[str, Any]:
        client = connect(host, port, timeout=SERVER_TIMEOUT, token=token)
        client.close()
        return client.marker

    marker: dict[str, Any] = run_in_thread(ask, SERVER_TIMEOUT + 5.0, "asking the server")  # handshake, then marker
    return marker  # (2 s grace)


def _nbdist_server_check(name: str, host: str, port: int, token: str | None, token_source: str) -> Check:
    """Is it nbdist's server, and does it take ``token``? ``connect`` raises the same errors a join would."""
    try:
        try:
            marker = _ask(host, port, token)
        except TokenError:
            if not token:  # the only refusal of no token: the server requires one
                return Check(name, "warn", "an nbdist server answers and requires a token; give it with --token "
                             "or NBDIST_TOKEN to check it")
            try:  # a token was refused: wrong, or the server requires none?
                marker = _ask(host, port, None)
            except TokenError:
                return Check(name, "FAIL", f"an nbdist server answers, but the token ({token_source}) is wrong: "
                             "%%dist_init with it would be refused",
                             "give the token that rank 0's %%dist_init (or `nbdist serve`) was started with, "
                             "with --token or NBDIST_TOKEN")
            return Check(name, "FAIL", f"an nbdist server answers ({_describe(marker)}) and requires no token, but "
                         f"one was given ({token_source}): %%dist_init with it would be refused",
                         "drop the token here, or start rank 0 (or `nbdist serve`) with the same --token")
    except NotNbdistServerError as exc:
        return Check(name, "FAIL", f"something answers, but not an nbdist server ({exc})",
                     "choose another --master-port, or stop the program on it")
    except NbdistError as exc:  # it was nbdist's, or might be, but stopped answering mid-check: stop nothing
        return Check(name, "FAIL", f"the check of the server did not finish ({exc})",
                     "run the doctor again (a busy host can be slow); if it fails the same way, see whether "
                     "rank 0's kernel (or `nbdist serve`) is stuck")
    if marker.get("auth") is None:
        return Check(name, "ok", f"an nbdist server answers ({_describe(marker)}); it requires no token")
    return Check(name, "ok", f"an nbdist server answers ({_describe(marker)}); it requires a token, and the one "
                 f"given ({token_source}) is right")


def _describe(marker: dict[str, Any]) -> str:
    return f"nbdist {marker.get('nbdist')} on {marker.get('host')}, pid {marker.get('pid')}"


def _local_port_check(port: int) -> Check:
    holder = netinfo.port_holder(port)
    if holder is None:
        return Check(f"local port {port}", "ok", "free")
    return Check(f"local port {port}", "info", f"in use by {holder}",
                 "fine if that is this world's rank 0 kernel or `nbdist serve`; else choose another --master-port")


def _hccl_port_checks(
    host: str, environ: Mapping[str, str], *, device_index: int = 0, hccn_timeout: float = 3.0
) -> list[Check]:
    """HCCL's host ports on rank 0's host, probed all at once; what cannot be probed from a host, said plainly."""
    return [_hccl_host_ports(host, environ), _hccl_npu_port(environ), _hccl_device_ip(device_index, hccn_timeout)]


def _hccl_host_ports(host: str, environ: Mapping[str, str]) -> Check:
    """HCCL's host ports on rank 0's host, probed all at once under one deadline."""
    spec = hcclports.host_ports(environ)
    name = f"HCCL host ports {host}"
    if spec.ports:
        name += f":{hcclports.format_ports(spec.ports)}"
    if spec.problem:
        fix = (f"set {spec.source} to one integer in {hcclports.BASE_PORT_MIN}-{hcclports.BASE_PORT_MAX}, or unset it"
               if spec.source == hcclports.BASE_PORT_VAR else f"set {spec.source} to {hcclports.FORMS}, or unset it")
        return Check(name, "FAIL", spec.problem, fix)
    if spec.auto:
        return Check(name, "info", f"{spec.label}: the OS picks them, so there is nothing fixed to probe",
                     "a firewall between the hosts must allow rank 0's ephemeral ports "
                     "(net.ipv4.ip_local_port_range), or set a fixed range, e.g. "
                     f"{hcclports.HOST_RANGE_VAR}=60000-60031")
    wanted = hcclports.format_ports(spec.ports)
    # Every port at once, under one deadline: 32 filtered ports cost one PROBE_TIMEOUT, not 32.
    pool = ThreadPoolExecutor(min(32, len(spec.ports)))
    futures = {pool.submit(probe, host, port, PROBE_TIMEOUT): port for port in spec.ports}
    done, _ = wait(futures, timeout=PROBE_TIMEOUT + 1.0)
    pool.shutdown(wait=False, cancel_futures=True)  # the few still running end within PROBE_TIMEOUT
    states = {futures[f]: f.result() for f in done}
    by_state: dict[str, list[int]] = {}
    for port in spec.ports:
        by_state.setdefault(states.get(port, "late"), []).append(port)
    n = {state: len(by_state.get(state, ())) for state in ("open", "refused", "timeout", "unreachable", "late")}
    parts = [f"{n['open']} open", f"{n['refused']} refused", f"{n['timeout']} filtered"]
    if n["unreachable"]:
        parts.append(f"{n['unreachable']} unreachable (no route)")
    if n["late"]:
        parts.append(f"{n['late']} not probed within {PROBE_TIMEOUT + 1.0:g} s")
    detail = f"{', '.join(parts)} ({spec.label})"
    if spec.capped:
        detail += f"; only the first {len(spec.ports)} of the {spec.total} ports it names are probed"
    if spec.note:
        detail += f"; {spec.note}"
    bad = by_state.get("timeout", []) + by_state.get("unreachable", [])
    if bad:
        if len(bad) < len(spec.ports):
            detail += f"; no answer from {hcclports.format_ports(sorted(bad))}"
        return Check(name, "FAIL", detail, f"open TCP {spec.value if spec.capped else wanted} on rank 0's "
                     "host to the other hosts")
    if n["late"]:
        return Check(name, "warn", detail, "run the doctor again; probes were slow")
    if n["refused"]:
        detail += ("; refused is normal before the first collective (HCCL listens only while a "
                   "communicator is being set up), and it means no firewall drops them")
    return Check(name, "ok", detail)


def _hccl_npu_port(environ: Mapping[str, str]) -> Check:
    """The NPU-side port: named, never probed (it lives on the device NIC)."""
    npu = hcclports.npu_ports(environ)
    name = "HCCL NPU port"
    if npu.problem:
        return Check(name, "FAIL", npu.problem, f"set {npu.source} to {hcclports.FORMS}, or unset it")
    which = "picked by the device (auto)" if npu.auto else hcclports.format_ports(npu.ports)
    return Check(name, "info", f"{which} ({npu.label}): it lives on the NPU's own network card (device "
                 "NIC, RoCE), not on the host, so it cannot be tested from here; the two NPUs' device "
                 "IPs must reach each other on it")


def _hccl_device_ip(device_index: int, hccn_timeout: float) -> Check:
    """The NPU's device IP, where the driver's hccn_tool can tell."""
    name = f"HCCL device IP (NPU {device_index})"
    tool = shutil.which("hccn_tool") or shutil.which("hccn_tool", path=HCCN_TOOL_DIR)
    if tool is None:
        return Check(name, "info", f"unknown: hccn_tool was found neither on PATH nor in {HCCN_TOOL_DIR}",
                     "install the Ascend driver's tools to read the device IP")
    command = [tool, "-i", str(device_index), "-ip", "-g"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=hccn_timeout,
                                check=False)
    except subprocess.TimeoutExpired:
        return Check(name, "warn", f"hccn_tool gave no answer within {hccn_timeout:g} s")
    except (OSError, subprocess.SubprocessError) as exc:
        return Check(name, "warn", f"hccn_tool could not run ({exc})")
    ip = hcclports.parse_hccn_ip(result.stdout)
    if ip is None:
        output = (result.stdout.strip() or result.stderr.strip() or "(no output)").splitlines()[0]
        return Check(name, "warn", f"`hccn_tool -i {device_index} -ip -g` printed no ipaddr "
                     f"(exit {result.returncode}): {output}")
    return Check(name, "info", f"{ip} (hccn_tool -i {device_index} -ip -g)",
                 f"the other host's NPU must reach it: `hccn_tool -i {device_index} -ping -g address {ip}` there")


def _device_checks() -> list[Check]:
    from . import ascend
    from .backends import guard_torch_import, npu_status

    usable, why, facts = npu_status()
    guard_torch_import(facts)  # before the import of torch below
    if usable:
        checks = [Check("NPUs", "ok", ascend.describe(facts))]
    elif facts.torch_npu is not None:
        checks = [Check("NPUs", "FAIL", why, "see the CANN installation guide; `source set_env.sh` in every "
                                             "notebook's environment before the kernel starts")]
    else:
        checks = [Check("NPUs", "info", why)]
    if facts.autoload_forced and not usable:
        checks.append(Check("TORCH_DEVICE_BACKEND_AUTOLOAD", "warn", "set to 1, but torch_npu cannot load here",
                            "unset it: with it, every `import torch` fails"))
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        checks.append(Check("CUDA", "ok", f"{n} ({', '.join(torch.cuda.get_device_name(i) for i in range(n))})"))
    else:
        checks.append(Check("CUDA", "info", "no CUDA device"))
    return checks


def _suspicious(master: str, environ: Mapping[str, str], ranks: Sequence[Mapping[str, Any]] | None) -> list[Check]:
    checks = []
    hosts = {r.get("node") for r in ranks or ()}
    if master in ("localhost", "127.0.0.1", "::1") and len(hosts) > 1:
        checks.append(Check("master address", "FAIL", f"{master} in a world spanning {len(hosts)} hosts",
                            "use rank 0's network address in every notebook"))
    ifname = environ.get("GLOO_SOCKET_IFNAME")
    if ifname and ifname not in {name for _, name in socket.if_nameindex()}:
        checks.append(Check("GLOO_SOCKET_IFNAME", "FAIL", f"names {ifname!r}, which this host does not have",
                            "unset it (nbdist sets it from the route to the master)"))
    if netinfo.hostname_is_loopback():
        checks.append(Check("hostname", "warn", f"{socket.gethostname()} resolves to a loopback address",
                            "gloo would advertise it to peers; nbdist sets GLOO_SOCKET_IFNAME for you"))
    return checks


def _version_checks(ranks: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks = []
    keys = ["torch", "nbdist", "python"]
    if any(r.get("backend") == "hccl" for r in ranks):
        keys += ["torch_npu", "cann"]  # HCCL refuses peers on another CANN version (EI0008)
    for key in keys:
        values = {str(r.get(key)) for r in ranks}
        status = "ok" if len(values) == 1 else ("warn" if key in ("nbdist", "python") else "FAIL")
        checks.append(Check(f"{key} versions", status, ", ".join(sorted(values))))
    return checks


def run(
    master_addr: str,
    master_port: int,
    backend: str = "auto",
    ranks: Sequence[Mapping[str, Any]] | None = None,
    environ: Mapping[str, str] | None = None,
    token: str | None = None,
    token_source: str = "--token",
) -> list[Check]:
    """All checks, in order; ``ranks`` are the joined ranks' registrations, when in a world.

    ``token`` (else ``NBDIST_TOKEN``) is checked against the server's; ``token_source`` says where it came from.
    A server that requires a token, checked without one, is a warning, not a failure.
    """
    environ = os.environ if environ is None else environ
    if not token:
        token, token_source = env_settings(environ).get("token"), "NBDIST_TOKEN"
    checks: list[Check] = []
    try:
        ip = netinfo.resolve(master_addr)
    except OSError as exc:
        return [Check("master address", "FAIL", f"{master_addr!r} does not resolve ({exc})",
                      "use rank 0's IP address (`ip addr` on its host)")]
    route = netinfo.route_to(ip, master_port)
    where = "this host" if route.master_is_local else f"via {route.interface or '?'} ({route.local_ip})"
    checks.append(Check("master address", "ok", f"{master_addr} is {ip}, reached {where}"))
    checks.append(_server_check(ip, master_port, route.master_is_local, token, token_source))
    if route.master_is_local:
        checks.append(_local_port_check(master_port))  # netinfo.port_holder hides a --token on the command line
    if backend == "hccl":
        checks += _hccl_port_checks(ip, environ)
    checks += _device_checks()
    if ranks:
        checks += _version_checks(ranks)
    checks += _suspicious(master_addr, environ, ranks)
    return checks


def for_world(cfg: WorldConfig | None, choice: Any, ranks: Sequence[Mapping[str, Any]] | None,
              master_addr: str | None, master_port: str | None, backend: str | None, token: str | None) -> list[Check]:
    """%dist_doctor: :func:`run`, each flag left None taken from the world this kernel joined (``cfg``, ``choice``:
    its backend; ``ranks``: its registrations), whose server is checked with the world's own token. Raises
    ConfigError (no master address, or a bad port)."""
    master = master_addr or (cfg.master_addr if cfg else None)
    if master is None:
        raise ConfigError("pass --master-addr (or run %%dist_init first)")
    port = validate(rank=0, world_size=1, master_addr="x",
                    master_port=master_port or (cfg.master_port if cfg else DEFAULT_PORT)).master_port
    backend = backend or (choice.backend if choice else "auto")
    source = "--token"
    if not token and cfg is not None and cfg.token:
        token, source = cfg.token, f"this world's, from {cfg.sources.get('token', '%%dist_init')}"
    return run(master, port, backend, ranks, token=token, token_source=source)


def report(checks: Sequence[Check]) -> str:
    failed = sum(c.status == "FAIL" for c in checks)
    verdict = "all checks passed" if not failed else f"{failed} check(s) failed"
    return "\n".join([*map(str, checks), f"nbdist doctor: {verdict}"])
