"""Checks of a finished run, for scenarios to combine; each raises :class:`Violation` saying what broke.

Times are virtual seconds since the run began.
"""

from __future__ import annotations

from collections.abc import Iterable

from nbdist.config import HEARTBEAT_INTERVAL, POLL_INTERVAL
from nbdist.errors import WaitTimeout
from nbdist.world import verdict as verdicts

from .explorer import Run
from .gate import Hung
from .scheduler import Outcome, Write

PROMPT = HEARTBEAT_INTERVAL + 2 * POLL_INTERVAL  # how soon after its cause a rank must have failed: a peer check


class Violation(AssertionError):
    """A run broke an invariant."""


def _timed_out(outcome: Outcome) -> bool:
    error = outcome.error
    while error is not None:
        if isinstance(error, (WaitTimeout, Hung)):
            return True
        error = error.__cause__ or error.__context__
    return False


def no_wait_ran_out(run: Run, ranks: Iterable[int] | None = None) -> None:
    """No wait of ``ranks`` (every rank's) ran out its timeout or never ended, in the scenario or the follow-up."""
    wanted = set(run.outcomes if ranks is None else ranks)
    for wait in run.waits:
        if wait.rank in wanted and wait.how == "timeout":
            raise Violation(
                f"{run.describe(wait.rank)} waited out its timeout ({wait.seconds:g} s) for "
                f"{', '.join(wait.keys)}, from {wait.start:.1f} s to {wait.end:.1f} s"
            )
    for phase, outcomes in (("", run.outcomes), ("in the follow-up ", run.followup or {})):
        for rank, outcome in sorted(outcomes.items()):
            if rank in wanted and _timed_out(outcome):
                raise Violation(f"{run.describe(rank)} ran out its timeout {phase}at {outcome.end:.1f} s: {outcome}")


def closes(write: Write) -> bool:
    """Whether a write told the others a rank failed or gave up: a failure record, or a meeting closed."""
    if write.op != "compare_set" or write.result != write.args[1]:
        return False  # not a compare-and-set that took
    if write.key.endswith("/failed"):
        return True
    decided = verdicts.decode(write.args[1])
    return write.key.endswith("/state") and not (decided is not None and decided.opened)


def no_wait_outlived_its_cause(run: Run) -> None:
    """No rank waited out its timeout after another rank had told the store it failed or gave up."""
    for wait in run.waits:
        if wait.how != "timeout":
            continue
        causes = [w for w in run.writes if w.rank != wait.rank and w.vt <= wait.end and closes(w)]
        if causes:
            first = causes[0]
            raise Violation(
                f"{run.describe(wait.rank)} waited out its timeout ({wait.seconds:g} s, until "
                f"{wait.end:.1f} s) for {', '.join(wait.keys)}, though {run.describe(first.rank)} had "
                f"written {first.key} = {first.args[1]!r} at {first.vt:.1f} s"
            )


def ended_with(run: Run, rank: int, *kinds: type[BaseException]) -> BaseException:
    """The rank ended with one of ``kinds``; returns the exception."""
    error = run.outcomes[rank].error
    if not isinstance(error, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise Violation(f"{run.describe(rank)} should have ended with {names}; it {run.outcomes[rank]}")
    return error


def names(run: Run, rank: int, culprit: int, *words: str) -> None:
    """The error ``rank`` ended with names ``culprit`` (its describe() text) and says ``words``."""
    text = str(run.outcomes[rank].error)
    for word in (run.describe(culprit), *words):
        if word not in text:
            raise Violation(f"{run.describe(rank)}'s error does not say {word!r}: {run.outcomes[rank]}")


def prompt(run: Run, rank: int, since: float, within: float = PROMPT) -> None:
    """``rank`` ended at most ``within`` virtual seconds after ``since`` (its cause)."""
    end = run.outcomes[rank].end
    if end - since > within:
        raise Violation(
            f"{run.describe(rank)} ended at {end:.1f} s, {end - since:.1f} s after its cause at "
            f"{since:.1f} s (allowed: {within:g} s): {run.outcomes[rank]}"
        )


def meets_again(run: Run) -> None:
    """In the follow-up every surviving rank read the same next step, and (if no rank died) its meeting opened."""
    if run.followup is None:
        return
    for rank, outcome in sorted(run.followup.items()):
        if outcome.error is not None:
            raise Violation(f"the next step failed on {run.describe(rank)}: {outcome}")
    steps = {rank: outcome.value[0] for rank, outcome in run.followup.items()}
    if len(set(steps.values())) > 1:
        raise Violation(f"the ranks disagree on the next step: {steps}")
    for rank, outcome in sorted(run.followup.items()):
        opened = outcome.value[1]
        if opened is not None and not opened.opened:
            raise Violation(f"the next step did not open on {run.describe(rank)}: {opened}")
