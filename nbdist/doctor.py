"""``%dist_doctor`` / ``nbdist doctor``: quick checks of what a world across hosts needs.

Each check is one line: pass, warn or fail, and the fix. Every probe has a
short timeout, so the whole run takes seconds and never hangs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import netinfo
from .errors import NbdistError
from .store import connect, probe, run_in_thread

PROBE_TIMEOUT = 2.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "warn", "FAIL", "info"
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        fix = f" → {self.fix}" if self.fix else ""
        return f"[{self.status:^4}] {self.name}: {self.detail}{fix}"


def _server_check(host: str, port: int, local: bool) -> Check:
    name = f"TCP to {host}:{port}"
    state = probe(host, port, PROBE_TIMEOUT)
    if state == "open":
        try:
            client = run_in_thread(lambda: connect(host, port, timeout=2.0), 5.0, "asking the server")
            marker = client.get_json("server")
            client.close()
        except NbdistError as exc:
            return Check(name, "FAIL", f"something answers, but not an nbdist server ({exc})",
                         "choose another --master-port, or stop the program on it")
        return Check(name, "ok", f"an nbdist server answers (nbdist {marker.get('nbdist')} on "
                     f"{marker.get('host')}, pid {marker.get('pid')})")
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


def _local_port_check(port: int) -> Check:
    holder = netinfo.port_holder(port)
    if holder is None:
        return Check(f"local port {port}", "ok", "free")
    return Check(f"local port {port}", "info", f"in use by {holder}",
                 "fine if that is this world's rank 0 kernel or `nbdist serve`; else choose another --master-port")


def _hccl_port_checks(host: str, environ: Mapping[str, str]) -> list[Check]:
    base = int(environ.get("HCCL_IF_BASE_PORT") or 60000)
    ports = [base, base + 15, int(environ.get("HCCL_NPU_SOCKET_PORT_RANGE", "16666").split("-")[0])]
    with ThreadPoolExecutor(len(ports)) as pool:
        states = list(pool.map(lambda p: probe(host, p, PROBE_TIMEOUT), ports))
    checks = []
    for port, state in zip(ports, states, strict=True):
        if state == "timeout":
            checks.append(Check(f"HCCL port {host}:{port}", "FAIL", "filtered (no answer)",
                                f"open TCP {base}-{base + 31} and 16666 between the notebooks"))
        else:
            detail = "reachable" if state == "open" else f"{state} (normal before the first collective)"
            checks.append(Check(f"HCCL port {host}:{port}", "ok", detail))
    return checks


def _device_checks() -> list[Check]:
    from .backends import _npu_status

    npu_usable, why = _npu_status()
    checks = []
    if npu_usable:
        try:
            import torch
            import torch_npu  # noqa: F401

            n = torch.npu.device_count()
            names = ", ".join(torch.npu.get_device_name(i) for i in range(n))
            checks.append(Check("NPUs", "ok" if n else "warn", f"{n} ({names or 'none'})"))
        except Exception as exc:  # shown to the user as the check's result
            checks.append(Check("NPUs", "FAIL", f"torch_npu present but unusable: {exc}"))
    else:
        checks.append(Check("NPUs", "info", why))
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
    for key in ("torch", "nbdist", "python"):
        values = {str(r.get(key)) for r in ranks}
        status = "ok" if len(values) == 1 else ("warn" if key != "torch" else "FAIL")
        checks.append(Check(f"{key} versions", status, ", ".join(sorted(values))))
    return checks


def run(
    master_addr: str,
    master_port: int,
    backend: str = "auto",
    ranks: Sequence[Mapping[str, Any]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Check]:
    """All checks, in order; ``ranks`` are the joined ranks' registrations, when in a world."""
    environ = os.environ if environ is None else environ
    checks: list[Check] = []
    try:
        ip = netinfo.resolve(master_addr)
    except OSError as exc:
        return [Check("master address", "FAIL", f"{master_addr!r} does not resolve ({exc})",
                      "use rank 0's IP address (`ip addr` on its host)")]
    route = netinfo.route_to(ip, master_port)
    where = "this host" if route.master_is_local else f"via {route.interface or '?'} ({route.local_ip})"
    checks.append(Check("master address", "ok", f"{master_addr} is {ip}, reached {where}"))
    checks.append(_server_check(ip, master_port, route.master_is_local))
    if route.master_is_local:
        checks.append(_local_port_check(master_port))
    if backend == "hccl":
        checks += _hccl_port_checks(ip, environ)
    checks += _device_checks()
    if ranks:
        checks += _version_checks(ranks)
    checks += _suspicious(master_addr, environ, ranks)
    return checks


def report(checks: Sequence[Check]) -> str:
    failed = sum(c.status == "FAIL" for c in checks)
    verdict = "all checks passed" if not failed else f"{failed} check(s) failed"
    return "\n".join([*map(str, checks), f"nbdist doctor: {verdict}"])
