"""The magics that find where the replicas part ways (``%dist_compare``). Thin, as :mod:`nbdist.magics`: parse, call,
display; what every rank runs is :mod:`nbdist.diverge`'s."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, magics_class
from IPython.core.magic_arguments import parse_argstring

from . import config
from .diverge import compare
from .errors import ConfigError
from .magicflags import argument, line_magic, magic_arguments
from .magics import DistMagics

NAME = "DivergeMagics"


@magics_class
class DivergeMagics(Magics):
    """nbdist's magics that compare what the ranks hold, on :class:`DistMagics`' session."""

    def __init__(self, shell: Any, dist: DistMagics) -> None:
        super().__init__(shell)
        self.dist = dist  # the session, and the %%collective a comparison runs as

    @magic_arguments()
    @argument("names", nargs="*", metavar="NAME", help="what to compare: tensors, modules (parameters and buffers), "
                                                        "optimizers (state by parameter name), state dicts, numbers, "
                                                        "text, and dicts and lists of these; a.b for an attribute")
    @argument("--rng", action="store_true", help="also compare the random generators: torch's CPU generator and "
                                                 "seed, each CUDA or NPU device's, Python's random, numpy's")
    @argument("--atol", type=float, metavar="X", help="elements within X (plus --rtol) of the largest group's count "
                                                      "as alike (default: bit for bit)")
    @argument("--rtol", type=float, metavar="Y", help="elements within Y times the largest group's value (plus "
                                                      "--atol) count as alike")
    @argument("--timeout", default=config.TIMEOUTS["barrier"],
              help=f"seconds each barrier waits for the other ranks (default {config.TIMEOUTS['barrier']:g})")
    @line_magic
    def dist_compare(self, line: str) -> None:
        """Compare what every rank holds under NAME... and say, in rank sets, which ranks hold which value.

        Runs as one %%collective on every rank: each rank digests what it holds, entry by entry (a module's
        parameters and buffers by name, an optimizer's state by parameter name, a dict's or list's items), and
        only the digests and a few numbers go between ranks, through torch.distributed. The answer is the same on
        every rank, so the table shows it once: "alike on ranks 0-3", or the groups of ranks, how many entries
        differ and the first (fc2.bias), with its elements that differ (index, values by rank set) and the largest
        difference from the largest group; only that entry's data is sent, by one rank of that group. With
        --atol/--rtol, entries within the tolerance count as alike (each entry whose digests differ is sent so).
        A name missing on some ranks, or of another kind there, is said. In peer notebooks, run it in every one.
        """
        args = parse_argstring(self.dist_compare, line)
        self.dist.session.require_world("%dist_compare")
        try:
            body = compare.command(args.names, args.rng, args.atol, args.rtol)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        self.dist.collective(f"--timeout {args.timeout}", body)
