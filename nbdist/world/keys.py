"""Every key nbdist keeps in the world's store, built in one place (issue 34, item 2).

The store client puts every key under ``nbdist/`` (:mod:`nbdist.world.store`). A world is formed in
numbered rounds (:mod:`nbdist.world.rendezvous`); what belongs to a round lives under ``r/<r>/``, which
:meth:`nbdist.world.world.World.key` prepends to the names this module builds for it. Nothing else in
nbdist writes a key by hand (``tests/world/test_keys.py`` reads the code to hold that).

Outside a round::

    round                         the current round's number
    server                        the server's marker (it is nbdist's, its host and pid, whether it wants a token)
    hb/<session>                  one kernel's heartbeat

A round (``r/<r>/`` + the names below)::

    size, count, ready, joined    the round forming: its world size; slots claimed; set once all are; who joined
    error                         a reason every rank of the round must fail
    rank/<i>                      rank i's registration
    last/<i>, busy/<i>            what rank i does (a :class:`.records.Note`: a barrier it waits at, the body it
                                  runs); whether a cell runs
    left/<i>, left_n              rank i left the world; how many did
    exited/<i>                    how spawned worker rank i's last kernel ended, and what then became of its slot
                                  (:class:`.exited_record.Exited`, written by the notebook that started it)
    gen                           the process group's generation: an older group is rebuilt at the next step
    turn                          the last step the world took (its next one is turn + 1)
    stops, stop/<n>               stops of every rank (%dist_stop, nbdist stop): how many; each one
    plain/failed_n, plain/failed/<k>
                                  plain cells that ended with an error during their collectives
                                  (each a :class:`.records.Failure`)
    drive/claim, drive/seq, drive/followers, drive/refused, drive/<seq>, follow/<i>
                                  one notebook driving the others (:mod:`nbdist.drive.follow`); a message and
                                  a refusal are :class:`.records.Message` and :class:`.records.Refusal`
    pg/<tag>/...                  torch's own keys of one build of the process group (``tag``: join, t<n>, ...)
    t/<n>                         step n (:func:`step`); a meeting under it (:func:`meeting`), and a cell's keys:
    t/<n>/src/<i>                 rank i's record at step n (what it runs there, compared by the last to arrive)
    t/<n>/in/n, in/state          the step's meeting: arrivals, the verdict (:mod:`.verdict`)
    t/<n>/failed                  the cell's first failure (:class:`.records.Failure`; the first one wins)
    t/<n>/fp/<group>/<seq>/...    a meeting per compared collective
    t/<n>/out/<i>, out/n, out/state
                                  rank i's capture; the cell's end meeting (its verdict says what the last to
                                  arrive found in every capture: :mod:`nbdist.cell.ending`); out/n also counts
                                  the ranks whose capture is in (:func:`ended`)
    t/<n>/live/<i>, live/n, live/ranks
                                  rank i's part of the live table; how many times the ranks published theirs;
                                  which ranks did (each appends ``<i>,`` once, after its part is in)
    t/<n>/init/<k>/<i>            rank i rebuilt the group in the body (the notebook's own init_process_group)
    where/asks, where/<k>/ask, where/<k>/rank/<i>, where/<k>/answered
                                  %dist_where (:mod:`nbdist.debug.where`): how many asked; the k-th request;
                                  rank i's answer; how many answered
    pdb/asks, pdb/<k>/ask, pdb/<k>/out/<j>, pdb/<k>/in/<j>
                                  %dist_pdb (:mod:`nbdist.debug.postmortem`): how many asked; the k-th request
                                  (it names the rank to debug); that rank's debugger output up to its j-th
                                  prompt; the j-th line typed for it
    bp/asks, bp/<k>/ask, bp/<k>/out/<j>, bp/<k>/in/<j>
                                  a breakpoint on a driven rank (:mod:`nbdist.debug.breakpoints`): how many
                                  stopped; the k-th (its rank and cell line); as pdb/ for its debugger
"""

from __future__ import annotations

# --- outside a round -----------------------------------------------------------------------------
ROUND = "round"
SERVER = "server"


def heartbeat(session: str) -> str:
    return f"hb/{session}"


def in_round(r: int, name: str) -> str:
    """``name`` (one of this module's) in round ``r``, as :meth:`World.key` puts it."""
    return f"r/{r}/{name}"


# --- a round -------------------------------------------------------------------------------------
SIZE = "size"
COUNT = "count"
READY = "ready"
JOINED = "joined"
ERROR = "error"
LEFT_N = "left_n"
GEN = "gen"
TURN = "turn"
STOPS = "stops"
PLAIN_FAILED_N = "plain/failed_n"
DRIVE_CLAIM = "drive/claim"
DRIVE_SEQ = "drive/seq"
DRIVE_FOLLOWERS = "drive/followers"
DRIVE_REFUSED = "drive/refused"
WHERE_ASKS = "where/asks"
PDB_ASKS = "pdb/asks"
BP_ASKS = "bp/asks"
WHOLE_ASKS = "whole/asks"


def rank(i: int) -> str:
    return f"rank/{i}"


def last(i: int) -> str:
    return f"last/{i}"


def busy(i: int) -> str:
    return f"busy/{i}"


def left(i: int) -> str:
    return f"left/{i}"


def stop(n: int) -> str:
    return f"stop/{n}"


def exited(i: int) -> str:
    """How spawned worker rank ``i``'s last kernel ended (:class:`nbdist.world.exited_record.Exited`)."""
    return f"exited/{i}"


def plain_failed(k: int) -> str:
    return f"plain/failed/{k}"


def drive(seq: int) -> str:
    return f"drive/{seq}"


def follow(i: int) -> str:
    return f"follow/{i}"


def where_ask(k: int) -> str:
    return f"where/{k}/ask"


def where_answer(k: int, i: int) -> str:
    return f"where/{k}/rank/{i}"


def where_answered(k: int) -> str:
    return f"where/{k}/answered"


def whole_ask(k: int) -> str:
    """Request ``k`` for a rank's whole output of a cell (:mod:`nbdist.cell.wholeask`)."""
    return f"whole/{k}/ask"


def whole_answer(k: int) -> str:
    return f"whole/{k}/answer"


def whole_part(k: int, i: int) -> str:
    return f"whole/{k}/part/{i}"


def pdb_ask(k: int) -> str:
    return f"pdb/{k}/ask"


def pdb_out(k: int, j: int, space: str = "pdb") -> str:
    """The debugger's output up to its ``j``-th prompt, of request ``k`` of ``space`` (pdb: %dist_pdb; bp: a
    breakpoint)."""
    return f"{space}/{k}/out/{j}"


def pdb_in(k: int, j: int, space: str = "pdb") -> str:
    return f"{space}/{k}/in/{j}"


def bp_ask(k: int) -> str:
    return f"bp/{k}/ask"


def process_group(tag: str) -> str:
    """The prefix of one build of the process group (torch's own keys go under it)."""
    return f"pg/{tag}"


# --- a step, and the meetings and cell under it --------------------------------------------------
def step(n: int) -> str:
    """Step ``n``: its meeting is ``meeting(step(n), "in")``; a ``%%collective``'s keys hang under it."""
    return f"t/{n}"


def arrival(n: int) -> str:
    """Step ``n``'s meeting, where the ranks arrive to take it together."""
    return meeting(step(n), "in")


def meeting(under: str, name: str) -> str:
    """A meeting (:func:`nbdist.world.gather.barrier`) called ``name`` under ``under`` (a step, a collective's)."""
    return f"{under}/{name}"


def arrivals(barrier: str) -> str:
    """How many ranks arrived at a meeting."""
    return f"{barrier}/n"


def state(barrier: str) -> str:
    """A meeting's verdict: unset while it is open (:mod:`nbdist.world.verdict`)."""
    return f"{barrier}/state"


def record(under: str, i: int) -> str:
    """Rank i's record at a step (``under``: :func:`step`), which the last rank to arrive compares."""
    return f"{under}/src/{i}"


def failed(cell: str) -> str:
    """A cell's first failure (``cell``: its step, :func:`step`)."""
    return f"{cell}/failed"


def ending(cell: str) -> str:
    """The meeting at a cell's end; each rank's capture is :func:`out`."""
    return f"{cell}/out"


def out(cell: str, i: int) -> str:
    return f"{cell}/out/{i}"


def ended(cell: str) -> str:
    """How many ranks ended ``cell``'s body: the arrivals at its end meeting, each of which published its
    capture (:func:`out`) before it arrived."""
    return arrivals(ending(cell))


def live(cell: str, i: int) -> str:
    return f"{cell}/live/{i}"


def live_count(cell: str) -> str:
    """How many times the ranks published their part of ``cell``'s live table (each adds one after it did)."""
    return f"{cell}/live/n"


def live_ranks(cell: str) -> str:
    """The ranks that published a part of ``cell``'s live table: ``<i>,`` appended by each, once its part is in."""
    return f"{cell}/live/ranks"


def compared(cell: str, group: str, seq: int) -> str:
    """The meeting at which the ranks compare collective ``seq`` of ``group``; each rank's is :func:`member`."""
    return f"{cell}/fp/{group}/{seq}"


def comparing(cell: str) -> str:
    """What every :func:`compared` meeting of a cell begins with."""
    return f"{cell}/fp/"


def member(meeting_: str, i: int) -> str:
    """Rank i's part of a meeting that keeps one key per rank beside its count (:func:`arrivals`)."""
    return f"{meeting_}/{i}"


def init_build(cell: str, k: int) -> str:
    """The ``k``-th group built again in a cell's body (the notebook's own ``init_process_group``)."""
    return f"{cell}/init/{k}"
