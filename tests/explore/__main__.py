"""Long explorations before a submission: ``python -m tests.explore --help``.

With 2 ranks every interleaving within ``--bound`` preemptions is explored (depth first); with 3, or with
``--seeds``, one random run per seed. Each scenario prints how many interleavings it explored and, for each
failure, its schedule, which ``--replay`` runs again. The exit status is 1 when a scenario failed that is not
known to (a scenario's ``known`` finding, printed as such).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .explorer import Lab, Result, exhaustive, randomly, replay
from .scenarios import SCENARIOS, scenario


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.explore", description=__doc__.split("\n\n")[1])
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        metavar="NAME",
        help=f"a scenario (repeatable; default: every one): {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--ranks", type=int, choices=(2, 3), default=2, help="simulated ranks (default 2)")
    parser.add_argument(
        "--seeds", type=int, metavar="N", help="random runs of seeds 0..N-1 (default with 3 ranks: 500)"
    )
    parser.add_argument(
        "--bound",
        type=int,
        default=2,
        metavar="K",
        help="exhaustive runs: at most K preemptions (default 2; -1: no bound)",
    )
    parser.add_argument("--cap", type=int, metavar="N", help="stop an exhaustive search after N runs")
    parser.add_argument("--replay", metavar="SCHEDULE", help="run one schedule of one --scenario again, and show it")
    parser.add_argument("--keep-going", action="store_true", help="go on after a scenario's first failure")
    parser.add_argument(
        "--show", type=int, default=3, metavar="N", help="failures shown per scenario, one per kind (default 3)"
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)
    if args.replay is not None and len(args.scenario or ()) != 1:
        parser.error("--replay needs exactly one --scenario")
    return args


def show(result: Result, limit: int, known: str | None) -> None:
    print(result.summary() + (f" [known: {known}]" if known and result.failures else ""), flush=True)
    kinds: dict[tuple[str, ...], int] = {}
    for failure in result.failures:
        kind = (failure.why.split(":")[0], *(f"{e.rank}{e.action}{e.op} {e.key}" for e in failure.run.events))
        kinds[kind] = kinds.get(kind, 0) + 1
        if kinds[kind] == 1 and len(kinds) <= limit:
            print(f"\n{failure}\n", flush=True)
    if len(kinds) > 1:
        print(f"  {len(result.failures)} failures of {len(kinds)} kinds (by what failed and where the events landed)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.list:
        for name, make in SCENARIOS.items():
            print(f"{name:18} {make(2).about}")
        return 0
    names = args.scenario or list(SCENARIOS)
    bound = None if args.bound < 0 else args.bound
    failed = False
    with Lab(ranks=args.ranks) as lab:
        for name in names:
            sc = scenario(name, args.ranks)
            if args.replay is not None:
                run, why = replay(lab, sc, args.replay)
                print(run.report(why or "no invariant broken"))
                return 1 if why else 0

            def progress(result: Result) -> None:
                print(f"  ... {result.runs} runs, {len(result.failures)} failing", file=sys.stderr, flush=True)

            if args.seeds is None and args.ranks == 2:
                result = exhaustive(lab, sc, bound, args.cap, args.keep_going, progress)
            else:
                result = randomly(lab, sc, range(args.seeds or 500), args.keep_going, progress)
            show(result, args.show, sc.known)
            failed = failed or bool(result.failures and not sc.known)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
