"""Which ports HCCL uses, read from CANN's environment variables: facts in, a ``PortSpec`` out.

Pure (no sockets, no subprocesses), so the doctor can trust it and the tests need no NPU.

What CANN documents (env var reference; same text in CANN 8.x and 9.0):

- ``HCCL_HOST_SOCKET_PORT_RANGE`` (envref_07_0143; hcclenvref_07_0020 in CANN 9.0) and
  ``HCCL_NPU_SOCKET_PORT_RANGE`` (envref_07_0144; hcclenvref_07_0021 in CANN 9.0): ``auto`` (the OS picks),
  one port ``60000``, a range ``60000-60050``, or a comma list of both ``60000,60050-60100,60150-60160``;
  ports in [1, 65535]; the entries of a list must not overlap.
- ``HCCL_IF_BASE_PORT`` (envref_07_0074): one integer in [1024, 65520]; HCCL takes 32 host ports from it,
  60000-60031 when unset. CANN up to 8.2 documented 16 ports (60000-60015); 8.5 and 9.0 say 32, which is
  what nbdist assumes (probing 16 ports too many costs nothing).
- The NPU side: "HCCL在NPU侧使用的通信端口默认为16666" (hcclenvref_07_0021, CANN 9.0). That port lives on
  the NPU's own network card (device NIC, RoCE), not on the host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

HOST_RANGE_VAR = "HCCL_HOST_SOCKET_PORT_RANGE"
NPU_RANGE_VAR = "HCCL_NPU_SOCKET_PORT_RANGE"
BASE_PORT_VAR = "HCCL_IF_BASE_PORT"

DEFAULT_BASE_PORT = 60000
BASE_PORT_COUNT = 32  # CANN <= 8.2 docs: 16
BASE_PORT_MIN, BASE_PORT_MAX = 1024, 65520
DEFAULT_NPU_PORT = 16666
MAX_PORTS = 1024  # a longer setting keeps only its first MAX_PORTS ports: the ones the doctor probes

FORMS = "auto, a port (60000), a range (60000-60050) or a comma list of both (60000,60005,61000-61050)"

_NUMBER = re.compile(r"[0-9]+")  # ASCII digits only: int() would also take "+5", "1_000" and "٥"


@dataclass(frozen=True)
class PortSpec:
    """The ports one HCCL setting names, or why it names none."""

    source: str  # the variable that decided, or "default"
    value: str = ""  # that variable's text, as set
    auto: bool = False  # "auto": the OS picks, nothing fixed to probe
    ports: tuple[int, ...] = ()  # in the order written, at most MAX_PORTS
    problem: str | None = None  # set when the value is invalid; then ports is empty
    total: int = 0  # how many ports the setting names; more than len(ports) when capped
    note: str = ""  # something worth telling, e.g. a variable the precedence rule ignores

    @property
    def label(self) -> str:
        return f"{self.source}={self.value}" if self.source != "default" else "CANN's default"

    @property
    def capped(self) -> bool:
        return self.total > len(self.ports)


def _port(text: str, entry: str) -> int:
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"{entry!r} is not a port or a range")
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is outside 1-65535")
    return port


def parse_range(text: str) -> tuple[int, ...]:
    """The ports a "60000", "60000-60050" or "60000,60005,61000-61050" value names, in the order written.

    Raises ``ValueError`` with a readable message for anything else, a reversed range, a port outside
    1-65535, or entries that overlap (CANN forbids that). ``auto`` is not a port list: callers check it first.
    """
    ports: list[int] = []
    seen: dict[int, str] = {}
    entries = [entry.strip() for entry in text.split(",")]
    for entry in entries:
        if not entry:
            raise ValueError(f"{text!r} has an empty entry")
        low_text, dash, high_text = entry.partition("-")
        low = _port(low_text.strip(), entry)
        high = _port(high_text.strip(), entry) if dash else low
        if high < low:
            raise ValueError(f"{entry} is reversed: write the lower port first ({high}-{low})")
        for port in range(low, high + 1):
            if port in seen:
                raise ValueError(f"{seen[port]} and {entry} overlap at port {port}: CANN forbids overlapping entries")
            seen[port] = entry
            ports.append(port)
    return tuple(ports)


def format_ports(ports: Iterable[int]) -> str:
    """The shortest text for ``ports`` in the variables' own syntax: runs of consecutive ports become ranges."""
    runs: list[list[int]] = []
    for port in ports:
        if runs and port == runs[-1][1] + 1:
            runs[-1][1] = port
        else:
            runs.append([port, port])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def _from_range(source: str, value: str, note: str = "") -> PortSpec:
    if value == "auto":
        return PortSpec(source, value, auto=True, note=note)
    try:
        ports = parse_range(value)
    except ValueError as exc:
        return PortSpec(source, value, problem=f"{source}={value!r}: {exc}", note=note)
    return PortSpec(source, value, ports=ports[:MAX_PORTS], total=len(ports), note=note)


def host_ports(environ: Mapping[str, str]) -> PortSpec:
    """The host ports HCCL listens on at rank 0 (the root), from the environment; empty values count as unset."""
    range_value = (environ.get(HOST_RANGE_VAR) or "").strip()
    base_value = (environ.get(BASE_PORT_VAR) or "").strip()
    # The rule nbdist assumes, as CANN documents it: HCCL_HOST_SOCKET_PORT_RANGE takes precedence over
    # HCCL_IF_BASE_PORT, even when its value is invalid (HCCL then fails rather than falling back).
    if range_value:
        note = f"{BASE_PORT_VAR}={base_value} is ignored: {HOST_RANGE_VAR} takes precedence" if base_value else ""
        return _from_range(HOST_RANGE_VAR, range_value, note)
    if not base_value:
        ports = tuple(range(DEFAULT_BASE_PORT, DEFAULT_BASE_PORT + BASE_PORT_COUNT))
        return PortSpec("default", ports=ports, total=len(ports))
    if not _NUMBER.fullmatch(base_value):
        return PortSpec(BASE_PORT_VAR, base_value, problem=f"{BASE_PORT_VAR}={base_value!r}: not an integer")
    if not BASE_PORT_MIN <= int(base_value) <= BASE_PORT_MAX:
        return PortSpec(BASE_PORT_VAR, base_value, problem=f"{BASE_PORT_VAR}={base_value!r}: "
                        f"outside {BASE_PORT_MIN}-{BASE_PORT_MAX}")
    base = int(base_value)
    # CANN's upper bound 65520 dates from 16-port blocks; a 32-port block from above 65504 stops at 65535.
    ports = tuple(range(base, min(base + BASE_PORT_COUNT, 65536)))
    return PortSpec(BASE_PORT_VAR, base_value, ports=ports, total=len(ports))


def npu_ports(environ: Mapping[str, str]) -> PortSpec:
    """The ports HCCL uses on the NPU's own network card (not the host's), from the environment."""
    value = (environ.get(NPU_RANGE_VAR) or "").strip()
    if not value:
        return PortSpec("default", ports=(DEFAULT_NPU_PORT,), total=1)
    return _from_range(NPU_RANGE_VAR, value)


_IPADDR = re.compile(r"^\s*ipaddr\s*:\s*(\S+)", re.MULTILINE)


def parse_hccn_ip(output: str) -> str | None:
    """The device IP in ``hccn_tool -i N -ip -g`` output (a line ``ipaddr:192.168.1.8``), or None."""
    match = _IPADDR.search(output)
    return match.group(1) if match else None
