"""One rank's outputs in order, bounded, with carriage returns honoured: pure, no kernel."""

from __future__ import annotations

import threading

from nbdist.cell.outputlog import OutputLog, collapse


def _kinds(log: OutputLog) -> list[tuple[str, str]]:
    return [(o["kind"], o.get("text") or o["data"].get("text/plain")) for o in log.snapshot()]


def test_outputs_keep_the_order_they_were_produced_in_and_runs_of_one_stream_are_joined() -> None:
    log = OutputLog()
    log.write("stdout", "one\n")
    log.display({"text/plain": "'two'"})
    log.write("stdout", "three\n")
    log.write("stderr", "four\n")
    log.write("stdout", "five\n")
    log.write("stdout", "six\n")
    assert _kinds(log) == [("stdout", "one\n"), ("display", "'two'"), ("stdout", "three\n"),
                           ("stderr", "four\n"), ("stdout", "five\nsix\n")]


def test_a_carriage_return_rewinds_its_line_as_a_terminal_would() -> None:
    assert collapse("10%\r20%\r30%") == "30%"
    assert collapse("a\r\nb\n") == "a\nb\n"
    assert collapse("keep\nold\rnew\n") == "keep\nnew\n"


def test_a_progress_bar_of_2000_steps_leaves_its_last_state_not_2000_lines() -> None:
    log = OutputLog()
    log.write("stdout", "training\n")
    for i in range(2001):
        log.write("stderr", f"\r{i / 20:5.1f}%|{'#' * (i // 200):10}| {i}/2000")
    log.write("stderr", "\n")
    (_, first), (kind, bar) = _kinds(log)
    assert first == "training\n" and kind == "stderr"
    assert bar == "100.0%|##########| 2000/2000\n"


def test_a_return_split_from_its_newline_across_writes_is_one_line_end() -> None:
    log = OutputLog()
    for part in ("a\r", "\nb", "\r", "c\n"):
        log.write("stdout", part)
    assert _kinds(log) == [("stdout", "a\nc\n")]


def test_a_bar_that_ended_with_a_return_shows_its_last_state() -> None:
    log = OutputLog()
    log.write("stdout", "\r50%\r")
    assert _kinds(log) == [("stdout", "50%")]


def test_a_long_log_keeps_its_head_and_latest_tail_and_says_what_it_dropped() -> None:
    log = OutputLog(limit=200, items=20)
    for i in range(10_000):
        log.write("stdout", f"line {i}\n")
    outputs = log.snapshot()
    assert outputs[0]["text"].startswith("line 0\n")
    assert outputs[-1]["text"].endswith("line 9999\n")
    assert outputs[1]["kind"] == "note" and "lines (99 kB) not shown: output truncated" in outputs[1]["text"]
    assert sum(len(o["text"]) for o in outputs) < 400


def test_many_displays_keep_the_first_and_the_latest_and_count_the_dropped() -> None:
    log = OutputLog(items=10)
    for i in range(100):
        log.display({"text/plain": str(i)})
    outputs = log.snapshot()
    assert [o["data"]["text/plain"] for o in outputs if o["kind"] == "display"] == [*map(str, range(5)),
                                                                                  *map(str, range(95, 100))]
    assert "90 displays not shown" in outputs[5]["text"]


def test_an_update_replaces_its_display_in_place_and_clear_output_forgets_everything() -> None:
    log = OutputLog()
    log.display({"text/plain": "0%"}, display_id="bar")
    log.write("stdout", "after\n")
    log.display({"text/plain": "100%"}, display_id="bar", update=True)
    assert _kinds(log) == [("display", "100%"), ("stdout", "after\n")]
    log.clear()
    assert log.snapshot() == []


def test_a_snapshot_taken_while_another_thread_writes_is_consistent() -> None:
    log = OutputLog(limit=1000, items=20)
    done = threading.Event()

    def write() -> None:
        for i in range(20_000):
            log.write("stdout" if i % 3 else "stderr", f"{i}\n")
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    while not done.is_set():
        outputs = log.snapshot()
        assert all(o["kind"] in ("stdout", "stderr", "note") for o in outputs)
    thread.join()
    assert log.snapshot()[-1]["text"].endswith("19999\n")


class _StoppedOnce(OutputLog):
    """A log whose ``at``-th run taken in is cut by the stop button, as a KeyboardInterrupt lands in the body's
    thread while its own print flushes the batch."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def _take(self, name: str, text: str) -> None:
        self.at -= 1
        if self.at == 0:
            raise KeyboardInterrupt
        super()._take(name, text)


def test_a_stop_that_lands_while_the_batch_is_taken_in_loses_none_of_it() -> None:
    log = _StoppedOnce(at=2)
    log.write("stdout", "one\n")
    log.write("stderr", "two\n")
    log.write("stdout", "three\n")
    try:
        log.display({"text/plain": "'four'"})  # flushes the batch first: the stop lands at its second run
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the stop did not land")
    assert _kinds(log) == [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n")]
    log.display({"text/plain": "'four'"})
    assert _kinds(log)[-1] == ("display", "'four'")
