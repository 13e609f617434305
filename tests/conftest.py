"""Fixtures: real kernels through jupyter_client, real TCP on free loopback ports."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import nbformat
import pytest

from nbdist.drive import kernels
from nbdist.world.records import Registration

_GIVEN: set[int] = set()

# torch looks up the name of every new store connection's peer (::ffff:127.0.0.1, which /etc/hosts rarely names); a
# resolver that drops some queries when many come at once (this machine's drops about one in 50) stalls that
# connection by glibc's 5 s per try, which a test then waits out (docs/development/benchmarks.md, "Rendezvous at
# scale"). One second is glibc's least; the kernels and commands the tests start inherit it. A RES_OPTIONS of the
# caller's own is kept.
os.environ.setdefault("RES_OPTIONS", "timeout:1")


class _Reaper:
    """Kernels a test is done with, shut down on a thread of their own while the next test runs: shutting a
    world's kernels down is a second or two of waiting, test after test. Every one is gone before the session
    ends (:func:`pytest_sessionfinish`); ports are never handed out twice (:func:`free_port`), so a world still
    leaving holds none that a later test is given."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []

    def later(self, ks: list[kernels.Kernel]) -> None:
        thread = threading.Thread(target=_shut_down, args=(list(ks),), name="nbdist-test-reaper", daemon=True)
        thread.start()
        self._threads.append(thread)

    def finish(self) -> None:
        for thread in self._threads:
            thread.join(120)


def _shut_down(ks: list[kernels.Kernel]) -> None:
    for k in reversed(ks):  # rank 0 hosts the server: stop it last
        try:
            k.shutdown()
        except Exception as exc:  # the test is over: say so, as its teardown would have
            print(f"nbdist tests: could not shut a kernel down: {exc!r}", file=sys.stderr)


REAPER = _Reaper()
STOP_WITHIN = 2.0  # seconds from a stop (the button, %dist_stop, nbdist stop) to the cell's end: the docs' promise
BUSY = 3.0  # seconds more a test allows it: two pytest workers share the 2 cores (runs measured 2.0 and 2.2 s)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    REAPER.finish()


# The suite runs in two pytest-xdist workers, a file to a worker (pyproject's addopts: ``-n 2 --dist loadfile
# --no-loadscope-reorder``). Files are handed out in collection order, so the heaviest go first: a run that handed
# out a long file last would end with one worker in it and the other idle. Seconds in one serial run on 2 cores
# (2026-12), heaviest first; the rest follow in pytest-randomly's order, as does every file's own order.
HEAVY_FIRST = (
    "test_export", "test_browser", "explore/test_scenarios", "test_long_cells", "test_faults", "test_many_ranks",
    "test_two_hosts", "test_hardening", "test_world", "test_slurm", "test_soak", "test_backends",
    "test_readme_commands", "test_bench", "test_course", "test_spawn", "test_restart", "test_tutorials",
    "test_ddp_replicas", "test_tunnel", "test_run", "test_store_timeout", "test_examples", "test_follow_command",
    "test_torch_own_collectives", "test_cli", "test_follow", "test_readme_claims", "test_breakpoints",
    "test_binder_limits", "test_types")


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle: a stable sort keeps its order within a weight
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    weight = {f"tests/{name}.py": i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: weight.get(item.nodeid.split("::")[0], len(HEAVY_FIRST)))


def free_port() -> int:
    """A free loopback port below the ephemeral range, so sockets opened later cannot take it.

    Stricter than nbdist's own check: bound without SO_REUSEADDR, so a port an earlier test's connections still
    hold in TIME_WAIT is passed over (a test's own listener, bound as a plain socket, would fail on it with
    "Address already in use"); and never one this run has handed out before."""
    low, span = _port_range()
    for _ in range(200):
        port = secrets.randbelow(span) + low
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{low + span - 1}")


def _port_range() -> tuple[int, int]:
    """This process's part of 20000-29999 (its first port, how many): all of it, or, in a pytest-xdist worker
    (``gw0``, ``gw1``, ...), its own share, so that two workers never hand out the same port (a port handed
    out is free when checked, and bound by its test later)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0):
        return 20_000, 10_000
    span = 10_000 // int(count)
    return 20_000 + int(worker[2:]) % int(count) * span, span


@pytest.fixture
def port() -> int:
    return free_port()


def as_generated(path: Path) -> str:
    """The example notebook at ``path`` as its generator writes it: without the outputs, execution counts
    and stamp that examples/execute.py adds (tests/test_examples_executed.py checks those)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    ours = nb.metadata.get("nbdist", {})
    ours.pop("executed", None)
    if not ours:
        nb.metadata.pop("nbdist", None)
    return nbformat.writes(nb, version=4)


def start_serve(port: int, *extra: str) -> subprocess.Popen:
    """`nbdist serve --host 127.0.0.1 --port PORT EXTRA...`, returned once it listens; the caller stops it."""
    from nbdist.world.store import probe

    proc = subprocess.Popen([sys.executable, "-m", "nbdist.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while probe("127.0.0.1", port, 0.5) != "open":
        if proc.poll() is not None:
            raise AssertionError(f"nbdist serve exited: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("nbdist serve did not start listening within 60 s")
        time.sleep(0.2)
    return proc


def ok(results: list[kernels.Result]) -> list[kernels.Result]:
    """The results, after asserting every rank's cell succeeded (naming the first that did not)."""
    for rank, r in enumerate(results):
        assert r.status == "ok", f"rank {rank}: {r.error}"
    return results


def form(ks: list[kernels.Kernel], port: int, extra: str = "") -> None:
    """``%%dist_init`` in every kernel at once: a world of ``len(ks)`` ranks on ``port``."""
    n = len(ks)
    ok(kernels.execute_all(ks, [init_line(i, n, port, extra) for i in range(n)], timeout=120))


@contextlib.contextmanager
def shared_world(n: int = 2) -> Iterator[SimpleNamespace]:
    """A formed world for a test module to share (``kernels``, ``port``, each kernel's ``baselines`` state)."""
    port = free_port()
    ks = kernels.start(n)
    try:
        ok(kernels.execute_all(ks, "%load_ext nbdist", timeout=60))
        form(ks, port)
        yield SimpleNamespace(kernels=ks, port=port, baselines=[kernel_state(k) for k in ks])
    finally:
        REAPER.later(ks)


@pytest.fixture(scope="session")
def two_kernels() -> Iterator[SimpleNamespace]:
    """Two kernels with nbdist loaded, kept for the session and lent to one module at a time by :func:`shared`
    (starting kernels and importing torch is what makes a world slow to form). ``kernels`` is empty until the
    first module asks, and again after a module left one of them dead; ``loaded`` is each one's state right
    after its ``%load_ext``."""
    pool = SimpleNamespace(kernels=[], loaded=[])
    yield pool
    for k in reversed(pool.kernels):  # rank 0 hosts the server: stop it last
        k.shutdown()


def _as_loaded(pool: SimpleNamespace) -> list[kernels.Kernel]:
    """The pool's kernels as they were after ``%load_ext nbdist``: no world, no server, a new session, the
    namespace and environment put back; or new kernels where one is gone or will not be put back."""
    if pool.kernels and all(k.manager.is_alive() for k in pool.kernels):
        try:
            for k, loaded in zip(pool.kernels, pool.loaded, strict=True):
                restore_kernel_state(k, loaded, reload_nbdist=True)
                if k.execute(_LOADED, timeout=60).text().strip() != "True":  # a test ran %unload_ext
                    ok([k.execute("%load_ext nbdist", timeout=60)])
            return pool.kernels
        except (AssertionError, RuntimeError, TimeoutError):
            pass  # a kernel that will not be put back (still busy, a restore that failed) is replaced below
    REAPER.later(pool.kernels)
    pool.kernels, pool.loaded = [], []
    ks = kernels.start(2)
    pool.kernels = ks  # shut down at the session's end even if loading fails
    ok(kernels.execute_all(ks, "%load_ext nbdist", timeout=60))
    pool.loaded = [kernel_state(k) for k in ks]
    return ks


_LOADED = "'DistMagics' in get_ipython().magics_manager.registry"


@pytest.fixture(scope="module")
def shared(two_kernels: SimpleNamespace) -> Iterator[SimpleNamespace]:
    """A two-rank world of its own for each test module that asks for it, formed on a new port in the
    session's two kernels (:func:`two_kernels`), each put back as it was after ``%load_ext`` first and
    again when the module is done (so no world lingers while other modules run): what :func:`shared_world`
    gives, without starting kernels."""
    ks = _as_loaded(two_kernels)
    port = free_port()
    form(ks, port)
    try:
        yield SimpleNamespace(kernels=ks, port=port, baselines=[kernel_state(k) for k in ks])
    finally:
        _as_loaded(two_kernels)


def lend(shared: SimpleNamespace, probe: str | None = None) -> Iterator[list[kernels.Kernel]]:
    """A module's shared world for one test (a fixture yields from it): formed again first if ``probe``,
    a cell run on every rank, fails (an earlier test broke it); each kernel's state put back afterwards."""
    ks = shared.kernels
    if probe is not None and any(r.status != "ok" for r in kernels.execute_all(ks, probe, timeout=90)):
        form(ks, shared.port)
    yield ks
    for k, baseline in zip(ks, shared.baselines, strict=True):
        restore_kernel_state(k, baseline, reload_nbdist=False)


def init_line(rank: int, world_size: int, port: int, extra: str = "") -> str:
    return f"%%dist_init --rank {rank} --world-size {world_size} --master-addr 127.0.0.1 --master-port {port} {extra}"


TWO_RANKS = [Registration(session="s0", rank=0, host="h", pid=1), Registration(session="s1", rank=1, host="h", pid=2)]


def written(world: Any) -> None:
    """After a write (``set``) by ``world`` that another world then reads: one round trip on ``world``'s
    connection. A TCPStore ``set`` does not wait for the server, and the server takes each connection's requests in
    order but the connections' in any order: another connection's read right after may come first (1,047 reads of
    20,000 missed a key just set, on 2 busy cores). In the protocol, the writer's next call on that connection
    (an arrival's ``add``) or a wait orders it."""
    world.client.get_if(world.key("written"))


@pytest.fixture
def two_worlds(port: int) -> Iterator[tuple[Any, Any]]:
    """Two ranks' worlds in this process, each with its own connection to a real server on loopback, both just
    joined (round 0, ranks :data:`TWO_RANKS`): a protocol's interleaving replayed at the store."""
    from nbdist.world.store import Server, connect
    from nbdist.world.world import World

    server = Server("127.0.0.1", port)
    clients = [connect("127.0.0.1", port) for _ in range(2)]
    try:
        first, second = (World(c, 0, i, 2, TWO_RANKS[i], TWO_RANKS) for i, c in enumerate(clients))
        first.last_turn = second.last_turn = first.turns.next() - 1
        yield first, second
    finally:
        for c in clients:
            c.close()
        server.stop()


@pytest.fixture
def start_kernels() -> Iterator[Callable[[int], list[kernels.Kernel]]]:
    """Factory: start N kernels with nbdist loaded; all are shut down after the test."""
    started: list[kernels.Kernel] = []

    def factory(n: int) -> list[kernels.Kernel]:
        ks = kernels.start(n)
        started.extend(ks)
        for r in kernels.execute_all(ks, "%load_ext nbdist", timeout=60):
            assert r.status == "ok", r.error
        return ks

    yield factory
    REAPER.later(started)


@pytest.fixture(scope="session")
def kernel_pool() -> Iterator[SimpleNamespace]:
    """Two kernels with nbdist loaded, kept for the session and lent to one test at a time by
    :func:`reused_kernels` (apart from :func:`two_kernels`, which one module holds at a time); as
    :func:`two_kernels`, empty until first asked for and after a test left one dead."""
    pool = SimpleNamespace(kernels=[], loaded=[], ready=False)
    yield pool
    for k in reversed(pool.kernels):  # rank 0 hosts the server: stop it last
        k.shutdown()


@pytest.fixture
def reused_kernels(kernel_pool: SimpleNamespace, start_kernels) -> Iterator[Callable[[int], list[kernels.Kernel]]]:
    """Factory as :func:`start_kernels`, but a test's first request for two kernels is met from the session's
    :func:`kernel_pool`, as they were after ``%load_ext nbdist`` (no world, no server, a new session, the
    namespace and environment put back). They have imported torch already, so the first world forms in a
    fraction of a second instead of the four a new pair takes to start, load and import. After the test they
    are put back the same way, or replaced where one died, still runs a cell, or will not be put back."""
    lent = False

    def factory(n: int) -> list[kernels.Kernel]:
        nonlocal lent
        if n != 2 or lent:
            return start_kernels(n)
        lent = True
        if not kernel_pool.ready:
            _as_loaded(kernel_pool)
        kernel_pool.ready = False
        return kernel_pool.kernels

    yield factory
    if lent:
        if any(t.is_alive() for t in _BACKGROUND):  # a cell still running: the kernel's client is in use
            REAPER.later(kernel_pool.kernels)
            kernel_pool.kernels, kernel_pool.loaded = [], []
        _as_loaded(kernel_pool)
        kernel_pool.ready = True


@pytest.fixture
def make_world(reused_kernels, port) -> Callable[[int], list[kernels.Kernel]]:
    """Factory: N kernels that have formed a world on a free port (two of them lent by :func:`reused_kernels`)."""

    def factory(n: int) -> list[kernels.Kernel]:
        ks = reused_kernels(n)
        results = kernels.execute_all(ks, [init_line(i, n, port) for i in range(n)], timeout=120)
        for i, r in enumerate(results):
            assert r.status == "ok", f"rank {i}: {r.error}"
        return ks

    return factory


@pytest.fixture
def driver() -> Iterator[kernels.Kernel]:
    """One kernel with nbdist loaded, to drive a world it spawns (``%dist_init --spawn N``)."""
    k = kernels.Kernel()
    try:
        assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
        yield k
    finally:
        REAPER.later([k])


@pytest.fixture
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A connection to a real store of its own, on loopback, its token the test module's ``TOKEN``."""
    from nbdist.world.store import Server, connect

    token = request.module.TOKEN
    server = Server("127.0.0.1", free_port(), token=token)
    try:
        c = connect("127.0.0.1", server.port, token=token)
        try:
            yield c
        finally:
            c.close()
    finally:
        server.stop()


@contextlib.contextmanager
def spawned_world(n: int, extra: str = "") -> Iterator[kernels.Kernel]:
    """One notebook driving ``n - 1`` spawned workers (``%dist_init --spawn N``), for a module to share."""
    k = kernels.Kernel()
    try:
        ok([k.execute("%load_ext nbdist", timeout=60)])
        ok([k.execute(f"%dist_init --spawn {n} --master-port {free_port()} {extra}".rstrip(), timeout=300)])
        yield k
    finally:
        REAPER.later([k])


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain_text(r: kernels.Result) -> str:
    """What a cell showed, without terminal colours."""
    return ANSI.sub("", r.text())


def typing(lines: list[str], first_look: float = 0.0) -> tuple[Callable[[str], str], list[str]]:
    """Answers for a kernel's input(): ``lines`` in turn, the first after ``first_look`` s; and the prompts."""
    prompts: list[str] = []

    def answer(prompt: str) -> str:
        prompts.append(prompt)
        if len(prompts) == 1:
            time.sleep(first_look)
        return lines.pop(0)

    return answer, prompts


@pytest.fixture
def record_fault(request) -> Callable[[str, float], None]:
    """Record a measured time-to-error (seconds) in pytest's cache, for the README's fault table."""

    def record(name: str, seconds: float) -> None:
        request.config.cache.set(f"nbdist/fault/{name}", round(seconds, 2))

    return record


def run_in_background(kernel: kernels.Kernel, code: str, timeout: float = 120) -> tuple[threading.Thread, dict]:
    """Start a cell without waiting; its Result lands in ``box["r"]`` and its end time in ``box["t"]``."""
    box: dict = {}

    def target() -> None:
        try:
            box["r"] = kernel.execute(code, timeout=timeout)
        except Exception as exc:  # a kernel that was killed on purpose never replies
            box["exc"] = exc
        box["t"] = time.monotonic()

    t = threading.Thread(target=target, daemon=True)  # never keeps pytest from exiting
    t.start()
    _BACKGROUND[:] = [*(b for b in _BACKGROUND if b.is_alive()), t]
    return t, box


_BACKGROUND: list[threading.Thread] = []  # cells run by :func:`run_in_background`, for :func:`reused_kernels`


def pid_gone(pid: int) -> bool:
    """Whether process ``pid`` is gone (a zombie left for its parent to reap counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


_SESSION = "get_ipython().magics_manager.registry['DistMagics'].session"


def world_round(kernel: kernels.Kernel) -> str:
    """The round of the world ``kernel`` is in (ask while it is idle: a busy kernel answers only after its cell)."""
    return kernel.execute("", timeout=60, user_expressions={"r": f"{_SESSION}.world.round"}).expression("r")


def wait_for_note(port: int, round_: str, rank: int, starts: str, box: dict | None = None,
                  within: float = 30) -> None:
    """Wait until ``rank``'s note (what it last did: %dist_status's column) starts with ``starts``, read from the
    world's store on loopback ``port``; fail after ``within`` s, or once the cell of ``box``
    (:func:`run_in_background`) ended first."""
    from nbdist.world import keys
    from nbdist.world.store import connect

    client = connect("127.0.0.1", port)
    key = keys.in_round(int(round_), keys.last(rank))
    try:
        deadline = time.monotonic() + within
        while not ((note := client.get_json_if(key) or {}).get("what") or "").startswith(starts):
            assert time.monotonic() < deadline, f"rank {rank} never noted {starts!r} within {within} s: {note}"
            assert box is None or "t" not in box, f"the cell ended before rank {rank} noted {starts!r}: {box}"
            time.sleep(0.05)
    finally:
        client.close()


def wait_gone(pids: list[int], within: float) -> float:
    started = time.monotonic()
    while not all(pid_gone(p) for p in pids):
        assert time.monotonic() - started < within, f"worker pids still alive after {within} s: " + \
            str([p for p in pids if not pid_gone(p)])
        time.sleep(0.1)
    return time.monotonic() - started


def skip_or_fail_in_ci(reason: str) -> NoReturn:
    """Skip with ``reason``; where ``CI`` is set (non-empty), fail with it instead: CI skips nothing silently."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this test must run, not be skipped)", pytrace=False)
    pytest.skip(reason)


_OUTPUT_TYPES = ("stream", "display_data", "execute_result", "error", "update_display_data")


def execute_timed(kernel: kernels.Kernel, code: str, timeout: float = 120) -> kernels.Result:
    """Like ``kernel.execute``; each output also has ``t``, the ``time.monotonic()`` here when it arrived."""
    outputs: list[dict[str, Any]] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] in _OUTPUT_TYPES:
            outputs.append({"msg_type": msg["msg_type"], "content": msg["content"], "t": time.monotonic()})

    reply = kernel.client.execute_interactive(code, timeout=timeout, output_hook=hook, allow_stdin=False)
    content = reply["content"]
    error = {k: content.get(k) for k in ("ename", "evalue", "traceback")} if content["status"] == "error" else None
    return kernels.Result(content["status"], outputs, error=error, payload=content.get("payload", []))


def run_timed_in_background(kernel: kernels.Kernel, code: str, timeout: float = 120) -> tuple[threading.Thread, dict]:
    """:func:`run_in_background` with :func:`execute_timed`: each output of ``box["r"]`` has its arrival time."""
    timed = SimpleNamespace(execute=lambda code, timeout: execute_timed(kernel, code, timeout))
    return run_in_background(timed, code, timeout)  # type: ignore[arg-type]


# --- one kernel shared by a module's tests, put back as it was after each test ------------------

_STATE = ("__import__('json').dumps({'names': sorted(get_ipython().user_ns), "
          "'environ': dict(__import__('os').environ)})")

_RESTORE = """\
def _nbdist_test_restore(names, environ, reload):
    import os
    shell = get_ipython()
    if reload and 'DistMagics' in shell.magics_manager.registry:
        shell.run_line_magic('reload_ext', 'nbdist')
    for name in set(shell.user_ns) - set(names):
        del shell.user_ns[name]
    os.environ.clear()
    os.environ.update(environ)
_nbdist_test_restore(*__import__('json').loads({payload!r}))
"""


def kernel_state(kernel: kernels.Kernel) -> dict[str, Any]:
    """The names in a kernel's user namespace and its environment variables (running nothing that adds any)."""
    r = kernel.execute("", timeout=60, user_expressions={"state": _STATE})
    return json.loads(ast.literal_eval(r.expression("state")))


def restore_kernel_state(kernel: kernels.Kernel, baseline: dict[str, Any], reload_nbdist: bool) -> None:
    """Put a shared kernel back as it was at ``baseline`` (see :func:`kernel_state`); fail if that did not work.

    With ``reload_nbdist``, ``%reload_ext nbdist`` first: the world is left, a hosted server
    stopped, and the session starts afresh (no configuration from the last test). Then the
    names the test added are deleted and ``os.environ`` is restored.
    """
    payload = json.dumps([baseline["names"], baseline["environ"], reload_nbdist])
    r = kernel.execute(_RESTORE.format(payload=payload), timeout=120)
    assert r.status == "ok", f"restoring the shared kernel failed: {r.error}"
    after = kernel_state(kernel)
    added = sorted(set(after["names"]) - set(baseline["names"]))
    removed = sorted(set(baseline["names"]) - set(after["names"]))
    assert not added and not removed, f"namespace not restored: added {added}, removed {removed}"
    assert after["environ"] == baseline["environ"], "os.environ not restored"


@pytest.fixture(scope="module")
def kernel_baseline(kernel: kernels.Kernel) -> dict[str, Any]:
    """The module's shared ``kernel`` as it was when first used (right after its ``%load_ext nbdist``)."""
    return kernel_state(kernel)


@pytest.fixture
def fresh_shared_kernel(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used its module's shared ``kernel``: nbdist reloaded, namespace and environment
    as they were after ``%load_ext`` (the kernel is shared because starting one is slow)."""
    if "kernel" not in request.fixturenames:
        yield
        return
    kernel = request.getfixturevalue("kernel")
    baseline = request.getfixturevalue("kernel_baseline")
    yield
    restore_kernel_state(kernel, baseline, reload_nbdist=True)


@pytest.fixture(scope="session")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Any]:
    """``nbdist run`` of an example notebook, once per session for every test that reads it
    (:func:`tests.exported.example_run`); the runs leave no kernel behind, only files."""
    from .exported import ExampleRun, example_run

    runs: dict[str, ExampleRun] = {}

    def get(name: str) -> ExampleRun:
        if name not in runs:  # a run that failed is not kept: the next test that asks runs it again
            runs[name] = example_run(name, tmp_path_factory.mktemp(name))
        return runs[name]

    return get


# One two-node Slurm cluster for the whole session, for every module that asks for it (tests/slurm.py imports
# this module's helpers, so it comes last).
from .slurm import slurm_cluster as slurm_cluster  # noqa: E402
