"""%dist_pdb's protocol on a real TCPStore: a rank's kept failure debugged from another, each line signed."""

from __future__ import annotations

import re
import socket

from nbdist.debug import postmortem, relay
from nbdist.world import keys, signing
from nbdist.world.heartbeat import Heartbeat
from nbdist.world.records import Registration
from nbdist.world.store import StoreClient
from nbdist.world.world import World

TOKEN = "pdb-test-token"
KEY = signing.key_from(TOKEN)
ROUND = 4
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def world_of_two(client: StoreClient, rank: int = 0) -> World:
    ranks = [Registration(session=f"s{i}", rank=i, host=socket.gethostname(), pid=100 + i) for i in range(2)]
    return World(client, ROUND, rank, 2, ranks[rank], ranks)


def failed_body(kept: postmortem.Kept) -> None:
    """A body that raised ZeroDivisionError with ``x`` = 41 in its innermost frame, kept as a rank keeps it."""
    def divide(x: int) -> float:
        return x / 0

    y = 7  # noqa: F841 (read from the outer frame in the debugger)
    try:
        divide(41)
    except ZeroDivisionError as exc:
        kept.body_ended(exc, exc.__traceback__)


def rank_one_answering(client: StoreClient, kept: postmortem.Kept) -> Heartbeat:
    """Rank 1's real heartbeat (this process stands for it), answering %dist_pdb from its kept failure."""
    responder = postmortem.responder(world_of_two(client, rank=1), lambda: TOKEN, kept)
    beat = Heartbeat(client.clone(), "s1", 1)
    beat.add_chore(responder.tick)
    return beat


def debug_rank_one(client: StoreClient, kept: postmortem.Kept, lines: list[str]) -> tuple[str, list[str]]:
    """What rank 0 shows while it debugs rank 1 typing ``lines``, and the prompts it showed."""
    shown: list[str] = []
    prompts: list[str] = []

    def read_line(prompt: str) -> str:
        prompts.append(prompt)
        return lines.pop(0)

    beat = rank_one_answering(client, kept)
    try:
        postmortem.ask(world_of_two(client), 1, KEY, write=shown.append, read_line=read_line, timeout=30)
    finally:
        beat.stop()
    return ANSI.sub("", "".join(shown)), prompts


def test_another_rank_opens_the_debugger_at_its_failing_frame_and_shows_its_own_values(client):
    kept = postmortem.Kept()
    failed_body(kept)
    text, prompts = debug_rank_one(client, kept, ["p x", "up", "p y", "q"])
    assert prompts == [f"rank 1 ({socket.gethostname()}) ipdb> "] * 4
    innermost, _, outer = text.partition("\n41\n")  # p x: rank 1's x, in the frame that raised
    assert "divide()" in innermost and "return x / 0" in innermost, text
    assert "failed_body()" in outer and "divide(41)" in outer and "\n7\n" in outer, text  # up, p y
    assert "nbdist: the debugger ended" in text


def test_end_of_input_quits_the_debugger_there(client):
    kept = postmortem.Kept()
    failed_body(kept)

    def eof(prompt: str) -> str:
        raise EOFError

    beat = rank_one_answering(client, kept)
    shown: list[str] = []
    try:
        postmortem.ask(world_of_two(client), 1, KEY, write=shown.append, read_line=eof, timeout=30)
    finally:
        beat.stop()
    assert "nbdist: the debugger ended" in "".join(shown)


def test_a_rank_whose_last_cell_succeeded_or_whose_next_cell_started_has_nothing_to_debug(client):
    kept = postmortem.Kept()
    failed_body(kept)
    kept.begin()
    text, _ = debug_rank_one(client, kept, [])
    host = socket.gethostname()
    assert f"nbdist: rank 1 ({host}) has no failed cell to debug since its next cell started" in text
    kept.body_ended(None, None)
    text, _ = debug_rank_one(client, kept, [])
    assert f"nbdist: rank 1 ({host}) has no failed cell to debug: its last cell succeeded" in text
    assert kept.get() == (None, None)


def test_a_request_for_another_rank_or_not_signed_with_the_worlds_key_opens_nothing(client):
    kept = postmortem.Kept()
    failed_body(kept)
    responder = postmortem.Responder(ROUND, 1, "rank 1", KEY, kept)
    n = client.add(keys.in_round(ROUND, keys.PDB_ASKS), 1)
    client.set_json(keys.in_round(ROUND, keys.pdb_ask(n)), signing.seal(KEY, postmortem.ASK,
                                                                        postmortem.Request(n, ROUND, 0).record()))
    responder.tick(client)
    assert responder.seen == n and responder.thread is None
    n = client.add(keys.in_round(ROUND, keys.PDB_ASKS), 1)
    forged = signing.seal(signing.key_from("another world"), postmortem.ASK, postmortem.Request(n, ROUND, 1).record())
    client.set_json(keys.in_round(ROUND, keys.pdb_ask(n)), forged)
    responder.tick(client)
    assert responder.seen == n and responder.thread is None
    assert client.get_json_if(keys.in_round(ROUND, keys.pdb_out(n, 0))) is None


def test_a_forged_a_replayed_and_another_ranks_line_are_refused(client):
    n = 5
    debugged = relay.Channel(client, KEY, ROUND, n, rank=1)
    asker = relay.Channel(client, KEY, ROUND, n, rank=1)
    line_key = keys.in_round(ROUND, keys.pdb_in(n, 0))

    client.set_json(line_key, signing.seal(signing.key_from("guess"), relay.IN,
                                           {"n": n, "round": ROUND, "rank": 1, "j": 0, "line": "!import os"}))
    assert debugged.line() == (False, None)  # forged: not signed with the world's key
    relay.Channel(client, KEY, ROUND, n, rank=5).send("p secret")  # signed, but for rank 5
    assert debugged.line() == (False, None)
    asker.send("p x")  # the genuine line overwrites what was there
    genuine = client.get_json_if(line_key)
    assert debugged.wait_line(30) == "p x"
    assert client.get_json_if(line_key) is None  # read once, then gone from the store

    client.set_json(keys.in_round(ROUND, keys.pdb_in(n, 1)), genuine)  # replayed at the next place
    assert debugged.line() == (False, None)
    client.set_json(keys.in_round(ROUND, keys.pdb_in(n + 1, 0)), genuine)  # replayed in the next request
    assert relay.Channel(client, KEY, ROUND, n + 1, rank=1).line() == (False, None)
    assert debugged.refused == {0, 1}
    asker.send(None)
    assert debugged.line() == (True, None)  # end of input, which quits the debugger


def test_an_output_chunk_not_signed_by_the_debugged_rank_is_not_shown(client):
    n = 6
    asker = relay.Channel(client, KEY, ROUND, n, rank=1)
    client.set_json(keys.in_round(ROUND, keys.pdb_out(n, 0)),
                    signing.seal(b"wrong", relay.OUT, {"n": n, "round": ROUND, "rank": 1, "j": 0,
                                                       "text": "type your password", "prompt": "ipdb> ", "end": None}))
    chunk = asker.receive(0.3, lambda: None)
    assert chunk.text == "" and chunk.end is not None and "no answer from rank 1" in chunk.end


def test_the_asker_names_a_debugged_rank_whose_kernel_is_gone(client):
    client.set_json(keys.heartbeat("s1"), {"n": 9, "t": 0.0, "rank": 1, "gone": True})  # what its pulse says at death
    shown: list[str] = []
    postmortem.ask(world_of_two(client), 1, KEY, write=shown.append, read_line=input, timeout=60)
    host = socket.gethostname()
    assert shown == [f"nbdist: rank 1 ({host}, pid 101) is gone: its kernel exited or was killed; its debugger ended "
                     "with it\n"], shown


def test_a_second_request_is_told_the_rank_is_busy_and_the_debugger_quits_when_the_asker_is_gone(client):
    kept = postmortem.Kept()
    failed_body(kept)
    world = world_of_two(client)
    responder = postmortem.Responder(ROUND, 1, "rank 1", KEY, kept, ranks=world.ranks)
    asker_beat = Heartbeat(client.clone(), "s0", 0)  # the asking notebook, alive

    def request() -> int:
        n = client.add(keys.in_round(ROUND, keys.PDB_ASKS), 1)
        client.set_json(keys.in_round(ROUND, keys.pdb_ask(n)),
                        signing.seal(KEY, postmortem.ASK, postmortem.Request(n, ROUND, 1, asker=0).record()))
        responder.tick(client)
        return n

    try:
        first = request()
        opened = relay.Channel(client, KEY, ROUND, first, rank=1).receive(30, lambda: None)
        assert "return x / 0" in ANSI.sub("", opened.text) and opened.end is None, opened
        second = request()
        busy = relay.Channel(client, KEY, ROUND, second, rank=1).receive(30, lambda: None)
        assert busy.end == "rank 1 is already in a %dist_pdb debugger: quit that one first"
    finally:
        asker_beat.stop()
    client.set_json(keys.heartbeat("s0"), {"n": 1, "t": 0.0, "rank": 0, "gone": True})  # its kernel died
    assert responder.thread is not None
    responder.thread.join(60)
    ended = relay.Channel(client, KEY, ROUND, first, rank=1)
    ended.j = 1
    chunk = ended.receive(30, lambda: None)
    assert chunk.end == "the asking notebook, rank 0, is gone: its kernel exited or was killed: the debugger quit"
    assert not responder.thread.is_alive()
    third = request()  # the rank is free again
    again = relay.Channel(client, KEY, ROUND, third, rank=1)
    assert "return x / 0" in ANSI.sub("", again.receive(30, lambda: None).text)
    again.send(None)  # end of input: it quits
    responder.thread.join(60)
    assert not responder.thread.is_alive()


def test_the_debugger_quits_when_the_debugged_ranks_next_cell_starts(client):
    kept = postmortem.Kept()
    failed_body(kept)
    responder = postmortem.Responder(ROUND, 1, "rank 1", KEY, kept)
    n = client.add(keys.in_round(ROUND, keys.PDB_ASKS), 1)
    client.set_json(keys.in_round(ROUND, keys.pdb_ask(n)),
                    signing.seal(KEY, postmortem.ASK, postmortem.Request(n, ROUND, 1).record()))
    responder.tick(client)
    asker = relay.Channel(client, KEY, ROUND, n, rank=1)
    assert asker.receive(30, lambda: None).end is None  # the debugger waits for a line
    kept.begin()  # the rank's next %%collective starts: its frames are let go, and the debugger with them
    asker.j = 1
    assert asker.receive(30, lambda: None).end == "rank 1 started its next cell or left its world: the debugger quit"
    assert responder.thread is not None
    responder.thread.join(60)
    assert not responder.thread.is_alive()
