"""A master reached through a tunnel or proxy: which interface the backend must advertise to the peers.

``ssh -L 29500:localhost:29500 rank0-host`` carries the rendezvous, but gloo, NCCL and HCCL connect the
ranks directly. A rank whose master address is loopback in a world that spans hosts would advertise
loopback, which the other hosts cannot reach: it must advertise the interface that routes to them.
Pure, given the ranks' registrations (each has ``addr``, its end of the route to the master, and
``addrs``, its host's addresses).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..world import netinfo
from .envplan import EnvVar

INTERFACE_VAR = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME", "hccl": "HCCL_IF_IP"}


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(netinfo.plain_ip(addr)).is_loopback
    except ValueError:
        return False


def elsewhere(info: dict[str, Any], mine: dict[str, Any]) -> bool:
    """Whether a rank's registration is from another host: another node, unless it has this one's very addresses
    (say two containers in one network namespace)."""
    if info.get("node") == mine.get("node"):
        return False
    return not (info.get("addrs") and set(info["addrs"]) == set(mine.get("addrs") or ()))


def detour(
    ranks: Sequence[dict[str, Any]],
    rank: int,
    backend: str,
    plan: Sequence[EnvVar],
    master_addr: str,
    hosting: bool,
    describe: Callable[[int], str],
) -> tuple[EnvVar | None, str, str]:
    """(the interface variable to use instead, a note for the init summary, this rank's address on that
    interface); (None, "", "") when there is nothing to do.

    Only nbdist's own value is replaced: one the user gave (environment, --env) is kept. Without a route to
    the other hosts, the variable is None and the note says how to name the interface.
    """
    mine = ranks[rank]
    key = INTERFACE_VAR.get(backend, "")
    planned = next((v for v in plan if v.key == key), None)
    if planned is None or planned.source != "nbdist" or not is_loopback(mine.get("addr", "")):
        return None, "", ""
    away = [i for i, info in enumerate(ranks) if elsewhere(info, mine)]
    for i in away:
        route = netinfo.route_to_peer([ranks[i].get("addr", ""), *ranks[i].get("addrs", [])])
        if route is not None:
            break
    else:
        if not away:
            return None, "", ""
        return None, (f"the master {master_addr} is on loopback here (a tunnel or proxy?) and the world spans "
                      f"hosts, but no interface here routes to {', '.join(describe(i) for i in away)}: {backend} "
                      f"would advertise {planned.value}, which they cannot reach, and the world would not form. "
                      f"Name the {'address' if key == 'HCCL_IF_IP' else 'interface'} that reaches them: "
                      f"--env {key}=..."), ""
    value = route.local_ip if key == "HCCL_IF_IP" else route.interface
    where = (f"this notebook serves the rendezvous on loopback ({master_addr}), for the other hosts to reach "
             "through a tunnel or proxy" if hosting else
             f"the master {master_addr} is reached through a tunnel or proxy (loopback here)")
    why = (f"{where}, and {backend} connects the ranks directly: {route.interface} ({route.local_ip}) is "
           f"the interface that routes to {describe(i)} at {route.master_ip}")
    return replace(planned, value=value, why=why), f"{why}, so {key}={value} (not {planned.value})", route.local_ip
