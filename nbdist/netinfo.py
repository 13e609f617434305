"""Facts about this host's network: which interface and address reach the master.

Nothing here sends a packet: the route is found by ``connect()`` on a UDP
socket, which only asks the kernel's routing table.
"""

from __future__ import annotations

import fcntl
import glob
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Route:
    """How this host reaches the master: local address, interface name, and whether it is this host."""

    master_ip: str
    local_ip: str
    interface: str
    master_is_local: bool


def interfaces() -> dict[str, str]:
    """IPv4 address of each interface that has one, by name (Linux)."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def resolve(host: str) -> str:
    """The IPv4 address of ``host`` (raises socket.gaierror when it does not resolve)."""
    return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]


def route_to(master: str, port: int = 29500) -> Route:
    """The local address and interface that traffic to ``master`` leaves from."""
    master_ip = resolve(master)
    addrs = interfaces()
    if master_ip in addrs.values() or ipaddress.ip_address(master_ip).is_loopback:
        name = next((n for n, a in addrs.items() if a == master_ip), None)
        if name is None:
            name = next((n for n, a in addrs.items() if ipaddress.ip_address(a).is_loopback), "lo")
        return Route(master_ip, master_ip, name, True)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master_ip, port))  # UDP connect: a routing lookup, no packet sent
        local_ip = s.getsockname()[0]
    name = next((n for n, a in addrs.items() if a == local_ip), "")
    return Route(master_ip, local_ip, name, False)


def hostname_is_loopback() -> bool:
    """Whether this host's own name resolves to a loopback address (common on cloud notebooks)."""
    try:
        return ipaddress.ip_address(resolve(socket.gethostname())).is_loopback
    except (OSError, ValueError):
        return False


def port_holder(port: int) -> str | None:
    """'pid N: command line' of the local process listening on ``port``, if this host can tell."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            if os.readlink(fd) in inodes:
                pid = fd.split("/")[2]
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                return f"pid {pid}: {cmd}"
        except OSError:
            continue
    return "a process this user cannot see"


def first_free_port(candidates: Iterable[int], host: str = "127.0.0.1") -> int | None:
    """The first of ``candidates`` that nothing holds on ``host`` (bound and released at once)."""
    for port in candidates:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    return None
