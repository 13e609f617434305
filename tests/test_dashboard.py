"""%dist_dashboard: the rows from the ranks' records (pure), the panel and its thread, and a real two-rank world."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from nbdist.drive import kernels
from nbdist.measure import dashboard
from nbdist.measure.dashboard import Reader, Seen, cell_of, failure_text, previous_cell, render_html, render_text, rows
from nbdist.view import sanitize
from nbdist.world.pulse import Beat
from nbdist.world.records import Busy, Failure, Note, Registration
from nbdist.world.world import World

from .conftest import BUSY, STOP_WITHIN, free_port, init_line, lend, ok, run_in_background

NOW = 1_000_000.0
INFO = Registration(session="s0", rank=0, host="vm", pid=7, device="cpu")


BEAT = {"n": 4, "t": NOW - 0.3}  # a beat as the store holds it


def _beat(ago: float = 0.3, **extra: Any) -> Beat:
    return Beat(4, NOW - ago, **extra)


def _row(**seen: Any) -> dashboard.Row:
    return rows([Seen(info=INFO, **seen)], NOW)[0]


# --- rows: pure --------------------------------------------------------------

def test_a_live_idle_rank_shows_joined_its_heartbeat_age_host_device_and_what_it_did_last():
    row = _row(beat=_beat(0.3), last=Note("finished %%collective #3", NOW - 12, cell=3))
    assert (row.rank, row.state, row.heartbeat, row.host, row.device) == (0, "joined", "0.3 s ago", "vm", "cpu")
    assert row.doing == "idle · last: finished %%collective #3, 12 s ago"
    assert not row.trouble and row.error == ""


def test_a_rank_in_a_collective_shows_the_cell_the_collective_number_and_op_and_for_how_long():
    last = Note("inside collective #2 (all_reduce) of %%collective #5", NOW - 3.25,
                collective="collective #2 (all_reduce)")
    assert _row(beat=_beat(), last=last).doing == "inside collective #2 (all_reduce) of %%collective #5 · 3.2 s"


def test_a_rank_at_a_barrier_shows_which_one():
    last = Note("waiting at %%collective #6 (start)", NOW - 40, barrier="t/6/in")
    assert _row(beat=_beat(), last=last).doing == "waiting at %%collective #6 (start) · 40 s"


def test_a_wait_that_ended_without_a_note_is_shown_as_over_once_the_rank_runs_no_cell():
    last = Note("waiting at %%collective #6 (start)", NOW - 40, barrier="t/6/in")
    assert _row(beat=_beat(), last=last, busy=Busy(False, NOW - 30)).doing == \
        "idle · last: waiting at %%collective #6 (start), 40 s ago"
    # A "no cell runs" from before the note is older news: the rank is at the barrier.
    assert _row(beat=_beat(), last=last, busy=Busy(False, NOW - 41)).doing.startswith("waiting at")


def test_a_rank_running_a_plain_cell_says_so_beside_its_last_note():
    row = _row(beat=_beat(), last=Note("joined", NOW - 5), busy=Busy(True, NOW - 5))
    assert row.doing == "running a cell · last: joined, 5.0 s ago"


def test_a_kernel_that_holds_the_gil_shows_how_long_its_python_has_not_run():
    assert _row(beat=_beat(0.4, busy=12.0)).heartbeat == "0.4 s ago · Python held 12 s"


@pytest.mark.parametrize(("seen", "state", "heartbeat"), [
    ({"left": True, "beat": None}, "left", "none"),
    ({"beat": _beat(0.2, gone=True)}, "gone", "gone: its kernel exited"),
    ({"beat": _beat(30.0)}, "not responding", "none for 30 s"),
    ({"beat": None}, "not responding", "none"),
])
def test_ranks_that_left_died_or_went_silent_are_marked(seen, state, heartbeat):
    row = _row(**seen)
    assert (row.state, row.heartbeat, row.trouble) == (state, heartbeat, True)


def test_a_rank_that_left_shows_nothing_it_does():
    assert _row(left=True, last=Note("left the world", NOW)).doing == ""


def test_the_cell_a_note_is_about_comes_from_its_body_its_barrier_or_its_number():
    assert cell_of(Note("running %%collective #3", NOW, body="t/3", cell=3)) == "t/3"
    assert cell_of(Note("waiting", NOW, barrier="t/4/out")) == "t/4"
    assert cell_of(Note("finished %%collective #2", NOW, cell=2)) == "t/2"
    assert cell_of(Note("waiting", NOW, barrier="t/1/fp/0/3")) == "t/1"
    assert cell_of(Note("waiting", NOW, barrier="other/1")) is None
    assert cell_of(None) is None
    assert previous_cell("t/4") == "t/3" and previous_cell("t/1") is None


def test_a_failure_reads_as_the_cell_and_what_happened_without_the_ranks_own_name():
    failure = Failure(1, "error", "rank 1 (vm, pid 9) raised ZeroDivisionError: division by zero")
    assert failure_text(failure, "t/7", "rank 1 (vm, pid 9)") == \
        "%%collective #7: raised ZeroDivisionError: division by zero"


def test_the_text_snapshot_is_an_aligned_table_with_every_column():
    table = rows([Seen(INFO, beat=_beat(), last=Note("joined", NOW)),
                  Seen(replace(INFO, host="other-host"), left=True)], NOW)
    text = render_text("title", table, ["last stop: stopped by rank 0"])
    lines = text.splitlines()
    assert lines[0] == "title" and lines[-1] == "last stop: stopped by rank 0"
    assert lines[1].split() == ["rank", "state", "heartbeat", "host", "device", "doing", "last", "error"]
    assert lines[2].index("vm") == lines[3].index("other-host") == lines[1].index("host")


def test_the_html_escapes_every_value_and_takes_its_colours_from_the_theme():
    evil = replace(INFO, host="<script>alert(1)</script>")
    markup = render_html("<b>t</b>", rows([Seen(evil, beat=_beat())], NOW))
    assert "<script>" not in markup and "&lt;script&gt;" in markup and "&lt;b&gt;t&lt;/b&gt;" in markup
    assert "var(--jp-border-color1" in markup


def test_the_theme_colours_come_through_nbdists_sanitiser_with_their_fallbacks():
    markup = render_html("t", rows([Seen(INFO, beat=_beat())], NOW))
    cleaned = sanitize.clean_html(markup)
    for declaration in ("border-color:var(--jp-border-color1, #80808059)",
                        "color:var(--jp-content-font-color1, inherit)"):
        assert declaration in markup and declaration in cleaned


# --- Reader: what it reads, on a store held in a dict -------------------------

class FakeStore:
    """The few StoreClient calls the reader makes, on a dict; counts the reads of keys that are not set."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = {k: json.dumps(v) for k, v in data.items()}
        self.missing_reads: list[str] = []
        self.closed = False

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get_if(self, key: str) -> str | None:
        if key not in self.data:
            self.missing_reads.append(key)
        return self.data.get(key)

    def get_json_if(self, key: str) -> Any:
        if key not in self.data:
            self.missing_reads.append(key)
            return None
        return json.loads(self.data[key])

    def close(self) -> None:
        self.closed = True


def _world(store: FakeStore, n: int = 2, gen: int = 0) -> World:
    ranks = [replace(INFO, session=f"s{i}", rank=i, pid=10 + i) for i in range(n)]
    world = World(store, round=3, rank=0, world_size=n, me=ranks[0], ranks=ranks)  # type: ignore[arg-type]
    world.gen = gen
    return world


def test_the_reader_finds_each_ranks_last_failure_and_the_worlds_last_stop():
    store = FakeStore({
        "r/3/last/0": {"what": "finished %%collective #4", "t": NOW, "cell": 4},
        "r/3/last/1": {"what": "waiting at %%collective #5 (start)", "t": NOW, "barrier": "t/5/in"},
        "r/3/t/3/failed": {"rank": 1, "kind": "error", "message": "rank 1 (vm, pid 11) raised KeyError: 'x'"},
        "r/3/t/4/failed": {"rank": -1, "kind": "stopped", "message": "stopped by rank 0 (vm, pid 10)"},
        "hb/s0": BEAT, "hb/s1": BEAT, "r/3/left/1": {"t": NOW},
    })
    reader = Reader(store, _world(store))  # type: ignore[arg-type]
    seen, stop = reader.read()
    assert [s.error for s in seen] == ["", "%%collective #3: raised KeyError: 'x'"]
    assert stop == "%%collective #4: stopped by rank 0 (vm, pid 10)"
    assert [s.left for s in seen] == [False, True]
    assert not [k for k in store.missing_reads if k.endswith("/failed")], "failures are looked for with check()"
    # A failure, once found, is kept: its cell may be long past.
    store.data["r/3/last/0"] = json.dumps({"what": "finished %%collective #9", "t": NOW, "cell": 9})
    store.data["r/3/last/1"] = json.dumps({"what": "finished %%collective #9", "t": NOW, "cell": 9})
    assert reader.read()[0][1].error == "%%collective #3: raised KeyError: 'x'"


# --- the panel and its thread, without a kernel -------------------------------

class FakePublisher:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, data: dict[str, Any], metadata: Any = None, transient: Any = None, update: bool = False) -> None:
        self.published.append({"data": data, "transient": transient, "update": update})


def _panel(stop_all: Any = None) -> tuple[dashboard.Dashboard, FakeStore, FakePublisher, SimpleNamespace]:
    store = FakeStore({"hb/s0": BEAT, "hb/s1": BEAT, "r/3/last/1": {"what": "joined", "t": time.time()}})
    world = _world(store)
    session = SimpleNamespace(world=world, require_world=lambda what: world)
    publisher = FakePublisher()
    dash = dashboard.Dashboard(session, store, publisher, stop_all or (lambda: 1))  # type: ignore[arg-type]
    return dash, store, publisher, session


def test_the_panels_bundle_is_the_widget_with_its_text_snapshot_for_frontends_without_widgets():
    dash, _, publisher, _ = _panel()
    dash._update()
    dash.show()
    bundle = publisher.published[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("nbdist dashboard · 2 rank(s) · round 3")
    assert "idle · last: joined" in bundle["text/plain"]
    dash.stop("test over")


def test_the_thread_redraws_at_most_twice_a_second_and_stops_joined_and_idempotently():
    dash, store, publisher, _ = _panel()
    dash._thread.start()
    time.sleep(1.3)
    drawn = dash.updates
    assert 1 <= drawn <= 3, drawn
    dash.stop("test over")
    assert not dash._thread.is_alive() and store.closed
    dash.stop("again")  # idempotent: nothing more happens
    assert dash.stopped == "test over" and dash.updates == drawn
    final = [p for p in publisher.published if p["update"]]
    assert len(final) == 1 and final[0]["data"]["text/plain"].endswith("stopped: test over")


def test_the_thread_stops_itself_when_the_notebook_leaves_the_world():
    dash, store, _, session = _panel()
    dash._thread.start()
    session.world = None
    dash._thread.join(3)
    assert not dash._thread.is_alive() and dash.stopped is not None and "left the world" in dash.stopped
    assert store.closed and dash._button.disabled


def test_the_button_does_what_dist_stop_does_and_says_so():
    calls = []
    dash, _, _, _ = _panel(lambda: calls.append(1) or 4)
    dash._button.click()
    assert calls == [1] and "stop #4 sent to every rank" in dash._status.value
    dash.stop("test over", show=False)


# --- a real world: two kernels ---------------------------------------------

ALL_REDUCE = "%%collective --timeout 60\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()\n"
PANEL = "get_ipython().magics_manager.registry['DistMagics'].dashboard"


@pytest.fixture
def world(shared) -> Iterator[list[kernels.Kernel]]:
    for ks in lend(shared, ALL_REDUCE):
        yield ks
        for k in ks:
            assert k.execute("%dist_dashboard --stop", timeout=30).status == "ok"


def _threads(kernel: kernels.Kernel) -> str:
    return kernel.execute("import threading; sorted(t.name for t in threading.enumerate())").text()


@pytest.mark.timeout(60)
def test_the_dashboard_updates_while_a_cell_runs_shows_a_failure_and_stops_with_dist_destroy(world):
    k0, k1 = world
    r = k0.execute("%dist_dashboard")
    assert r.status == "ok", r.error
    (shown,) = [o["content"] for o in r.outputs if o["msg_type"] == "display_data"]
    assert "application/vnd.jupyter.widget-view+json" in shown["data"]
    assert "heartbeat" in shown["data"]["text/plain"] and "joined" in shown["data"]["text/plain"]
    # While a cell runs here, the thread redraws the widget: comm messages, at most twice a second.
    updates: list[float] = []
    t0 = time.monotonic()
    k0.client.execute_interactive("import time; time.sleep(2.2)", timeout=30,
                                  output_hook=lambda m: m["msg_type"] == "comm_msg" and updates.append(
                                      time.monotonic() - t0))
    assert 3 <= len(updates) <= 6, updates
    # A failure on rank 1 shows as its last error.
    rs = kernels.execute_all(world, "%%collective --timeout 60\nif RANK == 1:\n    {}['missing']\n", timeout=60)
    assert rs[1].status == "error"
    deadline = time.monotonic() + 5
    while "KeyError: 'missing'" not in (text := k0.execute(f"{PANEL}.text()").text()):
        assert time.monotonic() < deadline, text
        time.sleep(0.3)
    assert "raised KeyError" in text
    r = k0.execute("%dist_destroy")
    assert r.status == "ok", r.error
    (final,) = [o["content"] for o in r.outputs if o["msg_type"] == "update_display_data"]
    assert final["data"]["text/plain"].endswith("stopped: this notebook left the world (%dist_destroy)")
    assert "nbdist-dashboard" not in _threads(k0)


@pytest.mark.timeout(60)
def test_the_button_stops_a_cell_running_on_another_rank(world):
    k0, k1 = world
    assert k0.execute("%dist_dashboard").status == "ok"
    model = k0.execute(f"{PANEL}._button.model_id").text().strip().strip("'")
    thread, box = run_in_background(k1, "import time\nfor _ in range(300): time.sleep(0.1)\n", timeout=60)
    time.sleep(1.0)  # rank 1 is inside its cell
    clicked = time.monotonic()
    click = {"comm_id": model, "data": {"method": "custom", "content": {"event": "click"}}}
    k0.client.shell_channel.send(k0.client.session.msg("comm_msg", click))
    thread.join(10)
    assert box["r"].status == "error" and box["r"].error["ename"] == "StoppedError", box["r"].error
    assert box["t"] - clicked < STOP_WITHIN + BUSY
    assert "with %dist_stop" in box["r"].error["evalue"]


@pytest.mark.timeout(60)
def test_unload_stops_the_dashboard_thread_and_a_snapshot_prints_without_widgets(world):
    k0, _ = world
    r = k0.execute("%dist_dashboard --once")
    assert r.status == "ok" and not [o for o in r.outputs if o["msg_type"] == "display_data"]
    assert "nbdist dashboard · 2 rank(s)" in r.text() and "heartbeat" in r.text()
    assert k0.execute("%dist_dashboard").status == "ok"
    assert "nbdist-dashboard" in _threads(k0)
    assert k0.execute("%dist_dashboard").status == "ok"  # a second one replaces the first
    assert _threads(k0).count("nbdist-dashboard") == 1
    assert k0.execute("%unload_ext nbdist").status == "ok"
    assert "nbdist-dashboard" not in _threads(k0)
    assert k0.execute("%load_ext nbdist").status == "ok"  # the next test's probe forms the world again


@pytest.mark.timeout(90)
def test_kernel_exit_stops_the_dashboard_thread_before_the_kernel_ends(tmp_path):
    (k,) = kernels.start(1)
    try:
        port = free_port()
        assert k.execute("%load_ext nbdist").status == "ok"
        ok([k.execute(init_line(0, 1, port), timeout=60)])
        # Registered first, so run last: after nbdist's own exit handlers.
        seen = tmp_path / "threads.txt"
        r = k.execute(f"import atexit, threading\natexit.register(lambda: open({str(seen)!r}, 'w').write("
                      "' '.join(t.name for t in threading.enumerate())))")
        assert r.status == "ok", r.error
        assert k.execute("%dist_dashboard").status == "ok"
        assert "nbdist-dashboard" in _threads(k)
    finally:
        k.shutdown()  # what is tested: the kernel's exit, before reading what it wrote
    text = seen.read_text()
    assert "MainThread" in text and "nbdist-dashboard" not in text


@pytest.mark.timeout(60)
def test_the_dashboard_has_generated_help_and_refuses_to_run_inside_a_collective(world):
    r = world[0].execute("%dist_dashboard?")
    assert "--once" in "".join(p.get("data", {}).get("text/plain", "") for p in r.payload)
    rs = ok(kernels.execute_all(world, "%%collective\ntry:\n    get_ipython().run_line_magic('dist_dashboard', '')\n"
                                       "except Exception as e:\n    print(type(e).__name__, e)\n", timeout=60))
    assert "UsageError" in rs[0].displays("text/plain")[-1] and "plain cell" in rs[0].displays("text/plain")[-1]
