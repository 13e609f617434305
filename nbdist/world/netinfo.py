"""Facts about this host's network: which interface and address reach the master.

Nothing here sends a packet: the route is found by ``connect()`` on a UDP
socket, which only asks the kernel's routing table.
"""

from __future__ import annotations

import fcntl
import glob
import ipaddress
import os
import re
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


def interfaces6() -> dict[str, list[str]]:
    """IPv6 addresses of each interface that has any, by name (Linux: /proc/net/if_inet6)."""
    found: dict[str, list[str]] = {}
    try:
        with open("/proc/net/if_inet6") as f:
            rows = f.read().splitlines()
    except OSError:
        return found
    for row in rows:
        fields = row.split()
        if len(fields) == 6:
            found.setdefault(fields[5], []).append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def resolve(host: str) -> str:
    """The address of ``host``, IPv4 if it has one, else IPv6 (raises socket.gaierror when it does not resolve)."""
    infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def _all_addresses() -> dict[str, str]:
    """Every local address (IPv4 and IPv6), mapped to its interface's name."""
    owners = {addr: name for name, addr in interfaces().items()}
    for name, addrs in interfaces6().items():
        for addr in addrs:
            owners.setdefault(addr, name)
    return owners


def route_to(master: str, port: int = 29500) -> Route:
    """The local address and interface that traffic to ``master`` leaves from."""
    master_ip = resolve(master)
    owners = _all_addresses()
    if master_ip in owners or ipaddress.ip_address(master_ip).is_loopback:
        name = owners.get(master_ip)
        if name is None:
            name = next((n for a, n in owners.items() if ipaddress.ip_address(a).is_loopback), "lo")
        return Route(master_ip, master_ip, name, True)
    family = socket.AF_INET6 if ":" in master_ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((master_ip, port))  # UDP connect: a routing lookup, no packet sent
        local_ip = s.getsockname()[0]
    return Route(master_ip, local_ip, owners.get(local_ip, ""), False)


def host_addresses() -> list[str]:
    """This host's IPv4 addresses other than loopback: where ranks on other hosts may reach it."""
    return [addr for addr in interfaces().values() if not ipaddress.ip_address(addr).is_loopback]


def route_to_peer(candidates: Iterable[str]) -> Route | None:
    """The route to the first of a peer's ``candidates`` addresses that leaves by a real interface, if any.

    Loopback addresses and this host's own are passed over: they would name this host, not the peer
    (two hosts often share an address, such as docker0's 172.17.0.1). ``master_ip`` is the peer's address.
    """
    own = _all_addresses()
    for candidate in candidates:
        try:
            ip = ipaddress.ip_address(plain_ip(candidate))
        except ValueError:
            continue
        if ip.is_loopback or ip.is_unspecified or str(ip) in own:
            continue
        try:
            route = route_to(str(ip))
        except OSError:  # no route from here (or a link-local address without its scope)
            continue
        if route.interface and not ipaddress.ip_address(route.local_ip).is_loopback:
            return route
    return None


def hostname_is_loopback() -> bool:
    """Whether this host's own name resolves to a loopback address (common on cloud notebooks)."""
    try:
        return ipaddress.ip_address(resolve(socket.gethostname())).is_loopback
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class TcpSocket:
    """One row of the kernel's TCP tables."""

    local: tuple[str, int]
    remote: tuple[str, int]
    listening: bool
    inode: int


def plain_ip(ip: str) -> str:
    """An IPv4-mapped IPv6 address as plain IPv4 ("::ffff:127.0.0.1" -> "127.0.0.1")."""
    return ip.removeprefix("::ffff:") if ip.startswith("::ffff:") and "." in ip else ip


def decode_endpoint(field: str) -> tuple[str, int]:
    """An endpoint as /proc/net/tcp{,6} writes it: hex address words in host byte order, then the port."""
    hex_ip, hex_port = field.split(":")
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return plain_ip(socket.inet_ntop(family, words)), int(hex_port, 16)


def tcp_sockets(proc: str = "/proc/net") -> list[TcpSocket]:
    """The TCP sockets of this network namespace (Linux; empty elsewhere)."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9:
                found.append(TcpSocket(decode_endpoint(fields[1]), decode_endpoint(fields[2]), fields[3] == "0A",
                                       int(fields[9])))
    return found


# A holder's command line may be `nbdist serve --token SECRET`: messages never show the secret.
_TOKEN_ARGUMENT = re.compile(r"(?<=--token[= ])\S+")


def port_holder(port: int) -> str | None:
    """'pid N: command line' of the local process listening on ``port`` (tokens hidden), if this host can tell."""
    inodes = {f"socket:[{s.inode}]" for s in tcp_sockets() if s.listening and s.local[1] == port}
    if not inodes:
        return None
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            if os.readlink(fd) in inodes:
                pid = fd.split("/")[2]
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                return f"pid {pid}: {_TOKEN_ARGUMENT.sub('(hidden)', cmd)}"
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
