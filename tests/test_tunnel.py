"""The README's SSH-tunnel recipe across two hosts (network namespaces, see tests/netns.py).

Host B reaches the rendezvous through a port forwarder on its loopback, as ``ssh -L`` makes one,
so its notebook says ``--master-addr 127.0.0.1``. gloo connects the ranks directly, not through
the tunnel: B's rank must advertise its real interface, not loopback.

Of each pair of ranks, gloo's rank with the larger address (then port) connects to the other
(gloo/transport/tcp/pair.cc, ``Pair::connect``). On 10.x addresses a rank advertising 127.0.0.1
connects out itself, and two ranks happen to work; so these hosts are on 198.18.X.0/24, above
127.0.0.1, as 172.16/12, 192.168/16 and most public addresses are: there A connects to what B
advertises.
"""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from nbdist.backend import tunnel
from nbdist.backend.envplan import EnvVar
from nbdist.drive import kernels
from nbdist.world import netinfo

from .conftest import run_in_background
from .netns import Host, TwoHosts, built_hosts
from .test_two_hosts import master_port, summary

# `ssh -L LISTEN:TARGET`, without ssh: every connection to LISTEN is piped to TARGET; exits after SECONDS.
FORWARDER = r"""
import socket, sys, threading, time
listen_host, listen_port, to_host, to_port, seconds = sys.argv[1:6]

def pipe(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        src.close()
        dst.close()

def serve(server):
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((to_host, int(to_port)), timeout=10)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()

server = socket.create_server((listen_host, int(listen_port)))
threading.Thread(target=serve, args=(server,), daemon=True).start()
print("listening", flush=True)
time.sleep(float(seconds))
"""

Forward = Callable[[Host, str, int, str, int], subprocess.Popen]


@pytest.fixture
def two_hosts() -> Iterator[TwoHosts]:
    """tests/netns.py's ``two_hosts``, on 198.18.X.0/24 (see the module's docstring)."""
    yield from built_hosts(net="198.18")


@pytest.fixture
def forward(two_hosts: TwoHosts) -> Iterator[Forward]:
    """Factory: a forwarder on a host, from ``listen`` to ``target``; stopped before the hosts are removed."""
    started: list[subprocess.Popen] = []

    def start(host: Host, listen: str, listen_port: int, target: str, target_port: int) -> subprocess.Popen:
        proc = host.popen([sys.executable, "-c", FORWARDER, listen, str(listen_port), target, str(target_port), "120"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else ""
        assert line.strip() == "listening", f"the forwarder on {host.hostname} did not start: {line!r}"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def _init_rank_0_first(ka, kb, lines: tuple[str, str], a: Host, server: tuple[str, int]) -> list[kernels.Result]:
    """Rank 0's %%dist_init, then rank 1's once A's server listens at ``server``.

    Through a tunnel the port always "listens" (the forwarder accepts, as ``ssh -L`` does): a rank that
    arrives before the server is told, after 15 s, that another program holds the port.
    """
    thread, box = run_in_background(ka, lines[0], timeout=90)
    code = f"import socket; socket.create_connection({server!r}, 1).close()"
    deadline = time.monotonic() + 60
    while a.python(code).returncode != 0:
        assert time.monotonic() < deadline and "r" not in box, f"rank 0's server never listened: {box}"
        time.sleep(0.2)
    second = kb.execute(lines[1], timeout=90)
    thread.join(timeout=90)
    assert "r" in box, "rank 0's %%dist_init never ended"
    return [box["r"], second]


def _load(ks: list[kernels.Kernel]) -> None:
    for r in kernels.execute_all(ks, "%load_ext nbdist\nimport os", timeout=60):
        assert r.status == "ok", r.error


def _all_reduce_crosses(ka, kb) -> None:
    cell = "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())\n"
    for k, r in zip((ka, kb), kernels.execute_all([ka, kb], cell, timeout=60), strict=True):
        assert r.status == "ok", f"{k.host.hostname}: {r.error}"
        assert k.expression("t.item()") == "2.0"


@pytest.mark.timeout(120)
def test_a_rank_behind_a_tunnel_advertises_the_interface_that_routes_to_rank_0(two_hosts: TwoHosts, forward):
    """Rank 0 serves on A's address; B reaches it as 127.0.0.1 (``ssh -L P:<A's address>:P``)."""
    a, b = two_hosts.a, two_hosts.b
    port = master_port()
    forward(b, "127.0.0.1", port, a.addr, port)
    ka, kb = two_hosts.start_kernels()
    _load([ka, kb])
    line = f"%%dist_init --world-size 2 --master-port {port} --timeout 60"
    results = _init_rank_0_first(ka, kb, (f"{line} --rank 0 --master-addr {a.addr}",
                                          f"{line} --rank 1 --master-addr 127.0.0.1"), a, (a.addr, port))
    for k, r in zip((ka, kb), results, strict=True):
        assert r.status == "ok", f"{k.host.hostname}: {r.error}\n{k.log()[-3000:]}"
    for k, host in ((ka, a), (kb, b)):
        assert k.expression("os.environ['GLOO_SOCKET_IFNAME']") == repr(host.ifname)
    text = summary(results[1])
    assert "reached through a tunnel or proxy" in text, text
    assert f"{b.ifname} ({b.addr}) is the interface that routes to rank 0 (hostA" in text, text
    assert f"GLOO_SOCKET_IFNAME={b.ifname}  # nbdist" in text, text  # the environment row shows the final value
    assert "tunnel" not in summary(results[0])  # rank 0 serves on its real address: nothing to change there
    env = kb.execute("%dist_env", timeout=30)
    assert env.status == "ok" and f"GLOO_SOCKET_IFNAME={b.ifname}" in env.text(), env.text()
    _all_reduce_crosses(ka, kb)
    for k in (kb, ka):
        assert k.execute("%dist_destroy", timeout=60).status == "ok"
    assert kb.expression("os.environ.get('GLOO_SOCKET_IFNAME')") == "None"  # leaving put it back


@pytest.mark.timeout(120)
def test_both_ranks_on_loopback_as_with_ssh_to_localhost_each_advertise_their_own_interface(two_hosts: TwoHosts,
                                                                                            forward):
    """Rank 0 serves on 127.0.0.1 only; ``ssh -L P:localhost:P`` is a forwarder on B and sshd's connection on A."""
    a, b = two_hosts.a, two_hosts.b
    port, relay = master_port(), master_port() + 1000
    forward(a, a.addr, relay, "127.0.0.1", port)  # what sshd on A does: connect to its own localhost
    forward(b, "127.0.0.1", port, a.addr, relay)
    ka, kb = two_hosts.start_kernels()
    _load([ka, kb])
    line = f"%%dist_init --world-size 2 --master-addr 127.0.0.1 --master-port {port} --timeout 60"
    results = _init_rank_0_first(ka, kb, (f"{line} --rank 0", f"{line} --rank 1"), a, ("127.0.0.1", port))
    for k, r in zip((ka, kb), results, strict=True):
        assert r.status == "ok", f"{k.host.hostname}: {r.error}\n{k.log()[-3000:]}"
    for k, r, host, other in ((ka, results[0], a, "rank 1 (hostB"), (kb, results[1], b, "rank 0 (hostA")):
        assert k.expression("os.environ['GLOO_SOCKET_IFNAME']") == repr(host.ifname)
        assert f"{host.ifname} ({host.addr}) is the interface that routes to {other}" in summary(r), summary(r)
    assert "serves the rendezvous on loopback" in summary(results[0])
    _all_reduce_crosses(ka, kb)
    for k in (kb, ka):
        assert k.execute("%dist_destroy", timeout=60).status == "ok"


@pytest.mark.timeout(120)
def test_a_users_own_interface_wins_and_loopback_behind_a_tunnel_cannot_form_the_world(two_hosts: TwoHosts,
                                                                                        forward):
    """What every such rank did before nbdist chose the interface for it: gloo on lo, and no world."""
    a, b = two_hosts.a, two_hosts.b
    port = master_port()
    forward(b, "127.0.0.1", port, a.addr, port)
    ka, kb = two_hosts.start_kernels()
    _load([ka, kb])
    line = f"%%dist_init --world-size 2 --master-port {port} --timeout 60 --pg-timeout 5"
    t0 = time.monotonic()
    results = _init_rank_0_first(ka, kb, (f"{line} --rank 0 --master-addr {a.addr}",
                                          f"{line} --rank 1 --master-addr 127.0.0.1 --env GLOO_SOCKET_IFNAME=lo"),
                                 a, (a.addr, port))
    seconds = time.monotonic() - t0
    assert kb.expression("os.environ['GLOO_SOCKET_IFNAME']") == "'lo'"  # --env wins
    ra, rb = results
    assert ra.status == "error" and "Connection refused" in ra.error["evalue"], ra.error  # A dialled its own lo
    assert "remote=[127.0.0.1]" in ra.error["evalue"], ra.error
    assert rb.status == "error" and "initialising the process group took longer than 5 s" in rb.error["evalue"]
    assert seconds < 30, f"{seconds:.1f} s"


def _detour_behind_tunnel(peer: dict, source: str = "nbdist") -> tuple:
    """tunnel.detour for rank 1 on loopback as after its join, rank 0 as ``peer`` says (no kernel, no store)."""
    mine = {"rank": 1, "node": "hostB/1", "addr": "127.0.0.1", "addrs": ["198.18.0.3"]}
    ranks = [{"rank": 0, "host": "hostA", "pid": 1, **peer}, mine]
    plan = [EnvVar("GLOO_SOCKET_IFNAME", "lo", "the interface that routes to the master", source)]
    return tunnel.detour(ranks, 1, "gloo", plan, "127.0.0.1", False, lambda i: f"rank {i} ({ranks[i]['host']}, pid 1)")


def test_a_rank_behind_a_tunnel_that_finds_no_route_to_the_others_says_how_to_name_the_interface():
    chosen, note, _ = _detour_behind_tunnel({"node": "hostA/0", "addr": "127.0.0.1", "addrs": []})
    assert chosen is None
    assert "no interface here routes to rank 0 (hostA, pid 1)" in note and "--env GLOO_SOCKET_IFNAME=" in note


def test_the_users_own_interface_and_a_peer_in_this_very_network_are_left_alone():
    for peer, source in (({"node": "hostA/0", "addr": "127.0.0.1", "addrs": []}, "--env"),
                         ({"node": "other/0", "addr": "127.0.0.1", "addrs": ["198.18.0.3"]}, "nbdist")):
        assert _detour_behind_tunnel(peer, source) == (None, "", ""), (peer, source)


def test_a_peers_own_loopback_and_this_hosts_addresses_are_not_routes_to_it():
    own = netinfo.host_addresses()
    assert netinfo.route_to_peer(["127.0.0.1", "::1", "0.0.0.0", "not an address", *own]) is None
