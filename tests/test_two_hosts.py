"""A world across two hosts: kernels in two network namespaces on a bridge (see tests/netns.py).

Both hostnames resolve to 127.0.0.1, as on many cloud notebooks: nbdist must still pick
each host's real interface, and the doctor must say so.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from datetime import datetime, timezone

import pytest

from nbdist.drive import kernels

from .netns import TwoHosts, Unsupported
from .netns import two_hosts as two_hosts  # the fixture

NBDIST = [sys.executable, "-m", "nbdist.cli"]


def master_port() -> int:
    """Any port: the namespaces are fresh, so nothing listens there."""
    return 29500 + secrets.randbelow(1000)


def summary(result: kernels.Result) -> str:
    """The text of the world summary %%dist_init showed last (not the live join status)."""
    texts = [o["content"]["data"].get("text/plain", "") for o in result.outputs if o["msg_type"] == "display_data"]
    found = [t for t in texts if t.startswith("nbdist world")]
    assert found, result.text()
    return found[-1]


def plan_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if not line.startswith("#")]


@pytest.mark.timeout(300)
def test_a_world_forms_across_two_hosts_and_all_reduce_crosses_them(two_hosts: TwoHosts):
    a, b = two_hosts.a, two_hosts.b
    port = master_port()
    ka, kb = two_hosts.start_kernels()
    for r in kernels.execute_all([ka, kb], "%load_ext nbdist\nimport os, socket", timeout=60):
        assert r.status == "ok", r.error
    # Each host calls itself by its own name, and that name resolves to loopback.
    for k, host in ((ka, a), (kb, b)):
        assert k.expression("socket.gethostname()") == repr(host.hostname)
        assert k.expression("socket.gethostbyname(socket.gethostname())") == "'127.0.0.1'"

    line = f"%%dist_init --world-size 2 --master-addr {a.addr} --master-port {port} --timeout 90"
    results = kernels.execute_all([ka, kb], [f"{line} --rank 0", f"{line} --rank 1"], timeout=150)
    for k, r in zip((ka, kb), results, strict=True):
        assert r.status == "ok", f"{k.host.hostname}: {r.error}\n{k.log()[-3000:]}"
        text = summary(r)
        assert "hostA" in text and "hostB" in text, text
    for k, host in ((ka, a), (kb, b)):
        ifname = k.expression("os.environ['GLOO_SOCKET_IFNAME']")
        assert ifname == repr(host.ifname), f"{host.hostname}: {ifname}"

    cell = ("%%collective\n"
            "t = torch.tensor([float(RANK)])\n"
            "dist.all_reduce(t)\n"
            "names = [None] * WORLD_SIZE\n"
            "dist.all_gather_object(names, socket.gethostname())\n")
    for k, r in zip((ka, kb), kernels.execute_all([ka, kb], cell, timeout=120), strict=True):
        assert r.status == "ok", f"{k.host.hostname}: {r.error}"
    for k in (ka, kb):
        # 0 + 1: rank 0 alone would have 0.0; the names show both directions crossed the bridge.
        assert k.expression("t.item()") == "1.0"
        assert k.expression("names") == "['hostA', 'hostB']"
        assert k.expression("dist.get_backend()") == "'gloo'"

    for k in (kb, ka):
        assert k.execute("%dist_destroy", timeout=60).status == "ok"


@pytest.mark.timeout(120)
def test_nbdist_env_on_host_b_shows_host_bs_address_as_hccl_if_ip(two_hosts: TwoHosts):
    a, b = two_hosts.a, two_hosts.b
    args = [*NBDIST, "env", "--backend", "hccl", "--world-size", "2", "--master-addr", a.addr]
    on_b = b.run([*args, "--rank", "1"])
    assert on_b.returncode == 0, on_b.stderr
    assert f"HCCL_IF_IP={b.addr}" in plan_lines(on_b.stdout), on_b.stdout
    assert f"{b.ifname} ({b.addr})" in on_b.stdout  # the reason names the interface that routes to A

    on_a = a.run([*args, "--rank", "0"])
    assert on_a.returncode == 0, on_a.stderr
    assert f"HCCL_IF_IP={a.addr}" in plan_lines(on_a.stdout), on_a.stdout
    assert "this host is the master" in on_a.stdout


def doctor_on(host, master, port: int) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = host.run([*NBDIST, "doctor", "--master-addr", master.addr, "--master-port", str(port)], timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, time.monotonic() - t0


def line_with(text: str, start: str) -> str:
    found = [line for line in text.splitlines() if start in line]
    assert len(found) == 1, text
    return found[0]


@pytest.mark.timeout(120)
def test_the_doctor_on_host_b_reports_a_master_port_where_nothing_listens(two_hosts: TwoHosts):
    a, b = two_hosts.a, two_hosts.b
    port = master_port()
    code, out, seconds = doctor_on(b, a, port)
    assert code == 1, out
    assert seconds < 30
    check = line_with(out, f"TCP to {a.addr}:{port}")
    assert "FAIL" in check and "connection refused" in check, check
    assert f"reached via {b.ifname} ({b.addr})" in line_with(out, "master address")


@pytest.mark.timeout(120)
def test_the_doctor_on_host_b_reports_no_answer_when_a_firewall_on_a_drops_the_port(two_hosts: TwoHosts):
    """iptables (or tc) on A when this machine has them; else a blackhole route on A, which looks the same to B."""
    a, b = two_hosts.a, two_hosts.b
    port = master_port()
    try:
        how = a.drop_tcp_port(port)
    except Unsupported as exc:  # no netfilter: A's answers to B vanish instead, which B cannot tell apart
        how = f"blackhole route on A to B ({exc})"
        a.blackhole_replies_to(b)
    code, out, seconds = doctor_on(b, a, port)
    assert code == 1, out
    assert seconds < 30, f"{seconds:.1f} s"
    check = line_with(out, f"TCP to {a.addr}:{port}")
    assert "FAIL" in check and "no answer" in check, f"{how}: {check}"


@pytest.mark.timeout(120)
def test_both_hostnames_resolve_to_loopback_and_the_doctor_on_host_b_warns_about_it(two_hosts: TwoHosts):
    code = "import socket; n = socket.gethostname(); print(n, socket.gethostbyname(n))"
    for host in two_hosts.hosts:
        proc = host.python(code)
        assert proc.stdout.split() == [host.hostname, "127.0.0.1"], proc.stderr
    _, out, _ = doctor_on(two_hosts.b, two_hosts.a, master_port())
    warning = line_with(out, "hostname:")
    assert warning.startswith("[warn]") and "hostB resolves to a loopback address" in warning, warning


@pytest.mark.timeout(120)
def test_a_host_whose_link_is_down_gets_no_answer_and_is_reachable_again_after_link_up(two_hosts: TwoHosts):
    a, b = two_hosts.a, two_hosts.b
    probe = f"from nbdist.world.store import probe; print(probe({a.addr!r}, 29400, 2.0))"
    assert b.python(probe).stdout.strip() == "refused"
    a.link_down()
    assert b.python(probe).stdout.strip() in ("timeout", "unreachable")
    a.link_up()
    deadline = time.monotonic() + 20
    while (state := b.python(probe).stdout.strip()) != "refused":
        assert time.monotonic() < deadline, state
        time.sleep(0.5)


def _form_world(two_hosts: TwoHosts, port: int) -> list:
    ka, kb = two_hosts.start_kernels()
    for r in kernels.execute_all([ka, kb], "%load_ext nbdist", timeout=60):
        assert r.status == "ok", r.error
    line = f"%%dist_init --world-size 2 --master-addr {two_hosts.a.addr} --master-port {port} --timeout 90"
    results = kernels.execute_all([ka, kb], [f"{line} --rank 0", f"{line} --rank 1"], timeout=150)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    return [ka, kb]


@pytest.mark.timeout(300)
def test_a_network_cut_ends_both_cells_naming_the_peer_and_one_init_each_recovers(two_hosts: TwoHosts,
                                                                                    record_fault):
    port = master_port()
    ka, kb = _form_world(two_hosts, port)
    loop = ("%%collective --timeout 20\nimport time\nfor i in range(100_000):\n    t = torch.ones(1)\n"
            "    dist.all_reduce(t)\n    time.sleep(0.01)\n")
    boxes: list[dict] = [{}, {}]

    def run(k, box):
        box["r"] = k.execute(loop, timeout=150)

    threads = [threading.Thread(target=run, args=(k, box), daemon=True) for k, box in zip((ka, kb), boxes, strict=True)]
    for t in threads:
        t.start()
    time.sleep(4)
    assert not any("r" in box for box in boxes), [box.get("r") and box["r"].error for box in boxes]
    cut = datetime.now(timezone.utc)
    two_hosts.b.link_down()
    # The test talks to host B's kernel over the same link: its reply waits for the link,
    # so each cell's end is read from the kernel's own reply time. Both must end within 14 s (below):
    # the link stays down a little longer than that (a cell still running then fails that bound anyway).
    time.sleep(15)
    two_hosts.b.link_up()
    for t in threads:
        t.join(timeout=90)
    for name, box in zip(("rank 0 (host A)", "rank 1 (host B)"), boxes, strict=True):
        assert "r" in box, f"{name}'s cell never ended"
        seconds = (box["r"].finished - cut).total_seconds()
        record_fault(f"network cut, --timeout 20: {name}", seconds)
        bound = 9 if name.startswith("rank 0") else 14  # the README: A about 6 s, B about 10 s
        assert seconds < bound, f"{name} took {seconds:.0f} s"
    ra, rb = boxes[0]["r"], boxes[1]["r"]
    assert ra.status == "error" and ra.error["ename"] == "PeerLostError", ra.error
    assert "rank 1 (hostB, pid " in ra.error["evalue"] and "stopped responding" in ra.error["evalue"], ra.error
    assert rb.status == "error" and rb.error["ename"] == "StoreConnectionError", rb.error
    assert "lost contact with rank 0 (hostA, pid " in rb.error["evalue"], rb.error
    assert "which hosts the rendezvous server" in rb.error["evalue"], rb.error
    line = f"%%dist_init --world-size 2 --master-addr {two_hosts.a.addr} --master-port {port} --timeout 90"
    results = kernels.execute_all([ka, kb], [f"{line} --rank 0", f"{line} --rank 1"], timeout=150)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    cell = "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()\n"
    for r in kernels.execute_all([ka, kb], cell, timeout=60):
        assert r.status == "ok" and "2.0" in r.text(), r.error


@pytest.mark.timeout(120)
def test_a_master_behind_a_dropping_firewall_is_reported_as_no_answer(two_hosts: TwoHosts, record_fault):
    a, b = two_hosts.a, two_hosts.b
    a.blackhole_replies_to(b)
    kb = b.start_kernel()
    assert kb.execute("%load_ext nbdist", timeout=60).status == "ok"
    # The bound is the wait the README promises, so the clock starts once torch is in: nbdist imports it at the
    # first store call. Idle, that import is about 1.5 s of the cell's 7; with the other worker's kernels starting
    # on the same 2 cores, the cell once took 19.8 s.
    assert kb.execute("import torch.distributed", timeout=120).status == "ok"
    t0 = time.monotonic()
    r = kb.execute(f"%%dist_init --rank 1 --world-size 2 --master-addr {a.addr} --master-port {master_port()} "
                   "--timeout 5", timeout=90)
    record_fault("master behind a dropping firewall, --timeout 5", time.monotonic() - t0)
    assert time.monotonic() - t0 < 10  # the README: 6.6 s with --timeout 5
    assert r.status == "error" and r.error["ename"] == "StoreConnectionError"
    assert f"no answer from {a.addr}" in r.error["evalue"] and "firewall" in r.error["evalue"]


_FOLLOWING = ("__import__('nbdist.drive.follow').drive.follow.following("
              "get_ipython().magics_manager.registry['DistMagics'].session.world)")


@pytest.mark.timeout(300)
def test_a_follower_on_host_a_runs_what_host_b_drives_with_a_token_and_is_refused_without_one(two_hosts: TwoHosts):
    a = two_hosts.a
    port = master_port()
    ka, kb = _form_world(two_hosts, port)
    # Without a token, following across hosts is refused: one line, nothing waits.
    r = ka.execute("%dist_follow", timeout=30)
    assert r.status == "error" and r.error["ename"] == "SigningError", r.error
    assert "needs a token" in r.error["evalue"] and len(r.error["traceback"]) == 1, r.error
    for k in (kb, ka):
        assert k.execute("%dist_destroy", timeout=60).status == "ok"
    # With one (a new world on another port): host B drives, host A (which hosts the server) follows.
    port = master_port() + 1000
    line = f"%%dist_init --world-size 2 --master-addr {a.addr} --master-port {port} --timeout 90 --token s3cret-{port}"
    results = kernels.execute_all([ka, kb], [f"{line} --rank 0", f"{line} --rank 1"], timeout=150)
    assert all(r.status == "ok" for r in results), [(r.error, r.text()[-1500:]) for r in results]
    box: dict = {}
    follower = threading.Thread(target=lambda: box.update(r=ka.execute("%dist_follow", timeout=200)), daemon=True)
    follower.start()
    deadline = time.monotonic() + 30
    while kb.expression(_FOLLOWING) != "[0]":
        assert time.monotonic() < deadline, "host A did not start following"
        time.sleep(0.2)
    cell = ("%%collective\nimport socket\nt = torch.tensor([float(RANK + 1)])\ndist.all_reduce(t)\n"
            "print(socket.gethostname(), t.item())\n")
    r = kb.execute(cell, timeout=60)
    assert r.status == "ok", r.error
    assert "hostA 3.0" in r.text() and "hostB 3.0" in r.text(), r.text()
    assert "released the world" in kb.execute("%dist_release", timeout=30).text()
    follower.join(60)
    assert "r" in box and box["r"].status == "ok", box
    shown = box["r"].text()
    assert "rank 1 (hostB" in shown and "runs %%collective #1" in shown, shown
    assert "hostA 3.0" in shown and "hostB 3.0" in shown, shown
