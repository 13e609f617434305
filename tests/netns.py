"""Two "hosts" on one machine: network namespaces joined by a bridge, with kernels running inside them.

Layout for a run id ``ID`` (four hex digits) and a third octet ``X`` picked from it::

    root namespace:  bridge nbdID-br 10.251.X.1/24, ports nbdIDa-br and nbdIDb-br
    namespace nbdA-ID: lo, nbdIDa 10.251.X.2/24, hostname hostA
    namespace nbdB-ID: lo, nbdIDb 10.251.X.3/24, hostname hostB

Each host's name resolves to 127.0.0.1, as on many cloud notebooks: ``ip netns exec``
bind-mounts ``/etc/netns/<ns>/hosts`` over ``/etc/hosts`` (and ``resolv.conf``, whose only
name server is 127.0.0.1), and every command runs under ``unshare --uts`` with the host's
name set. The namespaces have no default route: nothing run here can reach any
address but loopback and the 10.251.X.0/24 addresses above. ``TwoHosts(net="198.18")`` puts them in
198.18.X.0/24 instead (RFC 2544's range for test networks), for addresses that sort above 127.0.0.1.

Kernels are real ipykernels listening on the host's address; a
:class:`jupyter_client.BlockingKernelClient` in the root namespace reaches them over the
bridge. Everything is undone by :meth:`TwoHosts.close`, which is idempotent; the
``two_hosts`` fixture calls it even when set-up or the test failed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from nbdist.drive import kernels
from nbdist.drive.kernels import Result
from nbdist.world.store import probe

from .conftest import skip_or_fail_in_ci

NETNS_DIR = Path("/etc/netns")
# Variables a fresh host would not have: the test runner's own must not leak into the "hosts".
_HOST_LOCAL_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DEVICE_ID", "BACKEND",
                    "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_IF_IP")


class Unsupported(Exception):
    """This machine cannot provide what the harness needs (a reason to skip, not a failure, except under CI)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def skip_reason() -> str | None:
    """Why two-host tests cannot run here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if shutil.which("unshare") is None:
        return "the `unshare` command (util-linux) is not installed"
    try:
        proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns list` failed: {exc}"
    if proc.returncode != 0:
        return f"`ip netns` is unavailable: {proc.stderr.strip()}"
    return None


class NsKernel:
    """An ipykernel inside a namespace, driven from the root namespace over the bridge."""

    def __init__(self, host: Host, env: dict[str, str] | None = None) -> None:
        self.host = host
        self.dir = Path(tempfile.mkdtemp(prefix=f"nbdist-{host.hostname}-"))
        self.connection_file = str(self.dir / "kernel.json")
        ports = host.allocate_ports(5)
        write_connection_file(
            self.connection_file, ip=host.addr, transport="tcp", key=secrets.token_hex(16).encode(),
            shell_port=ports[0], iopub_port=ports[1], stdin_port=ports[2], control_port=ports[3], hb_port=ports[4],
        )
        self.log_path = self.dir / "kernel.log"
        self._log = open(self.log_path, "w")  # closed in shutdown()
        cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", self.connection_file,
               "--HistoryManager.hist_file=:memory:"]  # no shared history database to lock
        self.process = host.popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.client = BlockingKernelClient()
        try:
            # A client started before the kernel listens may judge it dead by its heartbeat
            # (seen under load): wait until the kernel's shell port answers first.
            deadline = time.monotonic() + 60
            while probe(host.addr, ports[0], 1.0) != "open":
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the kernel process exited or never listened")
                time.sleep(0.2)
            self.client.load_connection_file(self.connection_file)
            self.client.start_channels()
            self.client.wait_for_ready(timeout=60)
        except BaseException as exc:
            log = self.log()
            self.shutdown()
            raise RuntimeError(f"the kernel on {host.hostname} did not start: {exc}\n{log}") from None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        """The kernel process's own stdout and stderr so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def execute(self, code: str, timeout: float = 120, user_expressions: dict[str, str] | None = None) -> Result:
        """Run ``code``; raise TimeoutError if the kernel is not idle within ``timeout`` s."""
        return kernels.execute(self.client, code, timeout, user_expressions)

    def expression(self, expr: str, timeout: float = 60) -> str:
        """The repr of ``expr`` evaluated in the kernel."""
        r = self.execute("", timeout=timeout, user_expressions={"x": expr})
        return r.expression("x")

    def interrupt(self) -> None:
        """SIGINT to the kernel process, as the stop button does."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)

    def shutdown(self) -> None:
        """Ask the kernel to exit, then terminate, then kill; idempotent."""
        if self.process.poll() is None:
            try:
                self.client.shutdown()
                self.process.wait(timeout=5)
            except Exception:  # not answering, or never connected: terminated below
                pass
        self.client.stop_channels()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Host:
    """One namespace: its name, address, interface and hostname."""

    def __init__(self, hosts: TwoHosts, letter: str, addr: str) -> None:
        self.hosts = hosts
        self.ns = f"nbd{letter.upper()}-{hosts.run_id}"
        self.addr = addr
        self.ifname = f"nbd{hosts.run_id}{letter}"  # inside the namespace
        self.peer = f"{self.ifname}-br"  # its other end, a port of the bridge
        self.hostname = f"host{letter.upper()}"
        self._next_port = 40000 + secrets.randbelow(20000)

    def __repr__(self) -> str:
        return f"<Host {self.hostname} {self.addr} ({self.ns}, {self.ifname})>"

    def command(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` as run on this host: in its namespace, with its own hostname."""
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts",
                "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", self.hostname, *cmd]

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _HOST_LOCAL_VARS}
        env["PYTHONUNBUFFERED"] = "1"
        return {**env, **(extra or {})}

    def run(self, cmd: Sequence[str], timeout: float = 60, env: dict[str, str] | None = None,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on this host to completion; stdout and stderr captured as text."""
        return subprocess.run(self.command(cmd), capture_output=True, text=True, timeout=timeout,
                              env=self.env(env), **kwargs)

    def popen(self, cmd: Sequence[str], env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen:
        """Start ``cmd`` on this host. Every exec in the chain replaces the last: the pid is ``cmd``'s own."""
        return subprocess.Popen(self.command(cmd), env=self.env(env), **kwargs)

    def python(self, code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``python -c code`` on this host."""
        return self.run([sys.executable, "-c", code], timeout=timeout)

    def start_kernel(self, env: dict[str, str] | None = None) -> NsKernel:
        """A new kernel on this host; shut down with the hosts if the test does not."""
        kernel = NsKernel(self, env)
        self.hosts.kernels.append(kernel)
        return kernel

    def allocate_ports(self, n: int) -> list[int]:
        """Ports not yet handed out on this host (its namespace has a port space of its own)."""
        ports = list(range(self._next_port, self._next_port + n))
        self._next_port += n
        return ports

    def link_down(self) -> None:
        """Cut this host off: its bridge port goes down, so its interface loses carrier.

        Like a pulled cable: the host keeps its address and route, and packets vanish
        (peers see silence, then timeouts), rather than failing fast with "network unreachable".
        """
        _ip("link", "set", self.peer, "down")

    def link_up(self) -> None:
        """Reconnect this host (undoes :meth:`link_down`)."""
        _ip("link", "set", self.peer, "up")

    def drop_tcp_port(self, port: int) -> str:
        """Silently drop incoming TCP to ``port`` on this host, as a firewall does; returns how.

        iptables when it is installed, else a tc ingress filter; :class:`Unsupported` if neither works.
        """
        if shutil.which("iptables"):
            proc = self._in_ns("iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP")
            if proc.returncode == 0:
                return "iptables"
            why = f"iptables: {proc.stderr.strip()}"
        else:
            why = "iptables is not installed"
        if shutil.which("tc") is None:
            raise Unsupported(f"{why}; tc is not installed")
        proc = self._in_ns("tc", "qdisc", "add", "dev", self.ifname, "clsact")
        if proc.returncode == 0 or "File exists" in proc.stderr:
            for match in (["u32", "match", "ip", "protocol", "6", "0xff", "match", "ip", "dport", str(port), "0xffff"],
                          ["flower", "ip_proto", "tcp", "dst_port", str(port)]):
                proc = self._in_ns("tc", "filter", "add", "dev", self.ifname, "ingress", "protocol", "ip", *match,
                                   "action", "drop")
                if proc.returncode == 0:
                    return f"tc {match[0]}"
        raise Unsupported(f"{why}; tc: {' '.join(proc.stderr.split())}")

    def blackhole_replies_to(self, other: Host) -> None:
        """Route this host's packets to ``other`` into a blackhole.

        ``other``'s packets still arrive, but nothing answers them, not even a reset: to
        ``other`` every port here looks filtered, as behind a firewall that drops. Needs
        no netfilter (an alternative to :meth:`drop_tcp_port`, for every port at once).
        """
        _ip("-n", self.ns, "route", "add", "blackhole", f"{other.addr}/32")

    def _in_ns(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.ns, *cmd], capture_output=True, text=True, timeout=30)


class TwoHosts:
    """Hosts ``a`` and ``b`` on a bridge; :meth:`close` removes every trace."""

    def __init__(self, net: str = "10.251") -> None:
        # An id no namespace uses yet (a run killed before its cleanup leaves its namespaces behind).
        self.run_id = next(i for i in (secrets.token_hex(2) for _ in range(100))
                           if not any(Path(f"/run/netns/nbd{x}-{i}").exists() for x in "AB"))
        self.octet = _free_octet(int(self.run_id, 16), net)
        self.bridge = f"nbd{self.run_id}-br"
        self.bridge_addr = f"{net}.{self.octet}.1"
        self.a = Host(self, "a", f"{net}.{self.octet}.2")
        self.b = Host(self, "b", f"{net}.{self.octet}.3")
        self.kernels: list[NsKernel] = []
        self._made_netns_dir = False
        self._closed = False

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.a, self.b

    def start_kernels(self, hosts: Sequence[Host] | None = None) -> list[NsKernel]:
        """One kernel on each of ``hosts`` (default a, b), started in parallel; in that order."""
        hosts = list(self.hosts if hosts is None else hosts)
        started: list[NsKernel | BaseException | None] = [None] * len(hosts)

        def one(i: int) -> None:
            try:
                started[i] = hosts[i].start_kernel()
            except BaseException as exc:  # re-raised below; close() stops the ones that started
                started[i] = exc

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(hosts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in started:
            if isinstance(k, BaseException):
                raise k
        return started  # type: ignore[return-value]

    def create(self) -> TwoHosts:
        """Build everything; raises :class:`Unsupported` when this machine cannot."""
        try:
            for host in self.hosts:
                _ip("netns", "add", host.ns)
            _ip("link", "add", self.bridge, "type", "bridge")
            for host in self.hosts:
                _ip("link", "add", host.peer, "type", "veth", "peer", "name", host.ifname)
        except RuntimeError as exc:
            raise Unsupported(str(exc)) from None
        _ip("addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            _ip("link", "set", host.peer, "master", self.bridge)
            _ip("link", "set", host.peer, "up")
            _ip("link", "set", host.ifname, "netns", host.ns)
            _ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
            _ip("-n", host.ns, "link", "set", host.ifname, "up")
            _ip("-n", host.ns, "link", "set", "lo", "up")
            self._write_hosts_file(host)
        self._wait_reachable()
        return self

    def _write_hosts_file(self, host: Host) -> None:
        if not NETNS_DIR.exists():
            NETNS_DIR.mkdir()
            self._made_netns_dir = True
        folder = NETNS_DIR / host.ns
        folder.mkdir(exist_ok=True)
        (folder / "hosts").write_text(f"127.0.0.1 localhost {host.hostname}\n::1 localhost ip6-localhost\n")
        # DNS (torch's reverse lookups of peers, say) asks loopback, where nothing answers: no query leaves.
        (folder / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _wait_reachable(self, seconds: float = 10) -> None:
        """Until each host answers TCP from the other and from the root namespace (refused counts)."""
        code = ("import socket, sys\ns = socket.socket(); s.settimeout(1)\n"
                "sys.exit(0 if s.connect_ex((sys.argv[1], 9)) in (0, 111) else 1)")
        deadline = time.monotonic() + seconds
        pending = [(self.a, self.b.addr), (self.b, self.a.addr), (None, self.a.addr), (None, self.b.addr)]
        while pending:
            src, dst = pending[0]
            cmd = [sys.executable, "-c", code, dst]
            ok = (src.run(cmd, timeout=10) if src else subprocess.run(cmd, timeout=10)).returncode == 0
            if ok:
                pending.pop(0)
            elif time.monotonic() > deadline:
                raise RuntimeError(f"{dst} unreachable from {src or 'the root namespace'} after {seconds:g} s")
            else:
                time.sleep(0.2)

    def close(self) -> None:
        """Kill the kernels, delete namespaces, veths, bridge and hosts files; idempotent."""
        if self._closed:
            return
        errors: list[str] = []
        for kernel in reversed(self.kernels):  # host A's rank 0 usually hosts the server: stop it last
            try:
                kernel.shutdown()
            except Exception as exc:  # keep tearing down; reported below
                errors.append(f"kernel {kernel.pid}: {exc}")
        for host in self.hosts:
            pids = _ip("netns", "pids", host.ns, check=False).stdout.split()
            if pids:
                errors.append(f"processes left in {host.ns}: {', '.join(pids)}")
            _ip("netns", "del", host.ns, check=False)  # takes its veth end, and so the peer, with it
            _ip("link", "del", host.peer, check=False)
            shutil.rmtree(NETNS_DIR / host.ns, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
        if self._made_netns_dir:
            try:
                NETNS_DIR.rmdir()
            except OSError:
                pass  # someone else put something there meanwhile
        self._closed = True
        left = self.leftovers()
        if left:
            errors.append(f"left behind: {', '.join(left)}")
        if errors:
            raise RuntimeError("; ".join(errors))

    def leftovers(self) -> list[str]:
        """Namespaces, links and hosts files of this run that still exist."""
        names = {h.ns for h in self.hosts}
        netns = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
        links = [link["ifname"] for link in json.loads(_ip("-j", "link", check=False).stdout or "[]")]
        ours = {self.bridge, *(h.ifname for h in self.hosts), *(h.peer for h in self.hosts)}
        files = [str(NETNS_DIR / h.ns) for h in self.hosts if (NETNS_DIR / h.ns).exists()]
        return [n for n in netns if n in names] + [n for n in links if n in ours] + files


def _free_octet(seed: int, net: str = "10.251") -> int:
    """A third octet for ``net``.X.0/24 that no interface of the root namespace already uses."""
    used = _ip("-4", "-o", "addr", check=False).stdout + _ip("-4", "route", check=False).stdout
    for i in range(250):
        octet = 2 + (seed + i) % 250
        if f"{net}.{octet}." not in used:
            return octet
    raise Unsupported(f"every {net}.X.0/24 seems in use")


def built_hosts(net: str = "10.251") -> Iterator[TwoHosts]:
    """Build two hosts on ``net``.X.0/24, yield them, remove them: the body of the fixtures below and elsewhere.

    Skipped with the reason where this machine cannot build them; failed instead under CI (``CI`` set).
    """
    reason = skip_reason()
    if reason:
        skip_or_fail_in_ci(f"two-host test: {reason}")
    hosts = TwoHosts(net=net)
    try:
        try:
            hosts.create()
        except Unsupported as exc:
            skip_or_fail_in_ci(f"cannot build two hosts from network namespaces here: {exc}")
        yield hosts
    finally:
        hosts.close()


@pytest.fixture
def two_hosts() -> Iterator[TwoHosts]:
    """Hosts ``a`` and ``b``: namespaces on a bridge, with ``start_kernel()``, ``run()``, ``link_down()``."""
    yield from built_hosts()
