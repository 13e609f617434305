"""``%dist_bench``: the bandwidth of the raw collectives, measured on every rank in lockstep.

:func:`run` sends one generated body through ``Session.collective``, so it runs on every rank
(a driven world's followers and spawned workers too; peer notebooks that each run
``%dist_bench`` with the same flags meet in it). On each rank, :func:`measure` times the raw
torch functions (each wrapper's ``__nbdist_original__``: no fingerprints, no counting in the
timed loop) on tensors of the world's device, with ``torch.cuda.synchronize()`` /
``torch.npu.synchronize()`` after each iteration there. Per op and size: the median over
iterations on each rank, gathered to every rank after the timed loop (one checked
``all_gather_object``), and the slowest rank's median is the time. Rows reach the notebook
that ran the magic through its namespace, one by one, so a stopped bench keeps what it measured.
While a timed loop runs, the cell's checker says the body is inside a collective, so a stop on
any rank cuts the group and no rank waits in a loop its peers left.

send_recv is a ring, as in nccl-tests' sendrecv: each rank sends S to rank+1 and receives S from
rank-1 at once (``batch_isend_irecv``); with 2 ranks, an exchange between them.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..backend.backends import Choice
from ..cell import cellerror, cells
from ..config import TIMEOUTS
from ..errors import ConfigError, NbdistError
from ..world.world import World
from .benchreport import OPS, BenchResults, element_count, format_size, parse_ops, parse_sizes, row

DEFAULT_SIZES = "8:16M"
DEFAULT_ITERS = 20
DEFAULT_WARMUP = 5
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64")
ALIASES = {"half": "float16", "float": "float32", "double": "float64", "short": "int16", "int": "int32",
           "long": "int64"}
RESULTS_NAME = "_nbdist_bench_rows"  # the sink list in the user namespace of the notebook that ran the magic


@dataclass(frozen=True)
class Spec:
    """What one %dist_bench measures (the same on every rank)."""

    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    iters: int
    warmup: int
    dtype: str

    def describe(self) -> str:
        sizes = format_size(self.sizes[0]) if len(self.sizes) == 1 else \
            f"{format_size(self.sizes[0])}..{format_size(self.sizes[-1])} ({len(self.sizes)} sizes)"
        return (f"{', '.join(self.ops)} · S {sizes} · {self.dtype} · median of {self.iters} iteration(s) after "
                f"{self.warmup} warm-up")


def _count(flag: str, text: str | None, default: int, least: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{flag} takes a whole number, not {text!r}") from None
    if value < least:
        raise ConfigError(f"{flag} must be at least {least}, not {value}")
    return value


def spec(ops: str | None, sizes: str | None, iters: str | None, warmup: str | None, dtype: str | None,
         world_size: int) -> Spec:
    """The flags as a :class:`Spec`; raise :class:`ConfigError` naming the flag that is wrong."""
    chosen = parse_ops(ops) if ops is not None else OPS
    if world_size < 2 and "send_recv" in chosen:
        if ops is not None:
            raise ConfigError("--ops: send_recv needs at least 2 ranks")
        chosen = tuple(op for op in chosen if op != "send_recv")
    name = (dtype or "float32").removeprefix("torch.")
    name = ALIASES.get(name, name)
    if name not in DTYPES:
        raise ConfigError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    return Spec(chosen, parse_sizes(sizes if sizes is not None else DEFAULT_SIZES),
                _count("--iters", iters, DEFAULT_ITERS, 1), _count("--warmup", warmup, DEFAULT_WARMUP, 0), name)


def body(s: Spec) -> str:
    """The %%collective body that runs the bench on every rank (what followers show as its source)."""
    return (f"# %dist_bench: {s.describe()}\n"
            f"__import__('nbdist.measure.bench').measure.bench.measure({list(s.ops)!r}, {list(s.sizes)!r}, "
            f"{s.iters}, {s.warmup}, {s.dtype!r}, globals().get({RESULTS_NAME!r}), "
            "__import__('nbdist').get_device())\n")


def title(s: Spec, world_size: int, backend: str, device: Any, short: bool = False) -> str:
    """The table's title (``short``: the plot's)."""
    where = f"{world_size} rank{'s' if world_size != 1 else ''} · {backend} · {device} · {s.dtype}"
    if short:
        return f"busbw · {where} · median of {s.iters}, slowest rank"
    return f"%dist_bench · {where} · median of {s.iters} iteration(s) per rank ({s.warmup} warm-up), slowest rank"


class Benched(Protocol):
    """What ``%dist_bench`` reads and calls: the kernel's session, in these parts."""

    @property
    def shell(self) -> Any: ...  # IPython's, for its user namespace

    @property
    def world(self) -> World | None: ...

    @property
    def choice(self) -> Choice | None: ...

    @property
    def device(self) -> Any: ...  # the torch.device this rank uses

    def require_world(self, what: str) -> World: ...

    def collective(self, source: str, flags: cells.Flags, align: tuple[int, int] | None = None,
                   driver: int | None = None, shows_table: bool = True) -> cells.Outcome: ...


def run(session: Benched, s: Spec, sink: list[dict[str, Any]], timeout: float = TIMEOUTS["barrier"]) -> BenchResults:
    """Run the bench on every rank; rows land in ``sink`` as they are measured (a stopped bench keeps them).

    Raises what the cell ended with on this rank (KeyboardInterrupt for the stop button here,
    PeerFailedError when another rank stopped or failed).
    """
    world = session.require_world("%dist_bench")
    ns = session.shell.user_ns
    ns[RESULTS_NAME] = sink
    try:
        outcome = session.collective(body(s), cells.Flags(timeout, live=False), shows_table=False)  # its own table
    finally:
        if ns.get(RESULTS_NAME) is sink:
            del ns[RESULTS_NAME]
    error = cellerror.error_for(world, outcome)
    if error is not None:
        raise error
    return BenchResults(sink)


def run_shown(session: Benched, s: Spec) -> BenchResults:
    """:func:`run`, shown in this notebook: a status line, then the table (partial on a stop) and the plot."""
    from IPython.display import display

    from ..view.display import Message
    from .benchreport import BenchPlot, BenchTable, plot_png

    world, choice = session.require_world("%dist_bench"), session.choice  # the magic required it already
    assert choice is not None  # set as the rank joined, before its world
    where = (world.world_size, choice.backend, session.device)
    heading = title(s, *where)
    handle = display(Message(f"nbdist: %dist_bench on {world.world_size} ranks: {s.describe()}…"), display_id=True)
    rows: list[dict[str, Any]] = []
    try:
        results = run(session, s, rows)
    except (NbdistError, KeyboardInterrupt) as exc:
        stopped = f"{type(exc).__name__}: {len(rows)} of {len(s.ops) * len(s.sizes)} measured"
        handle.update(BenchTable(rows, f"{heading} · partial ({stopped})") if rows
                      else Message(f"nbdist: %dist_bench stopped before any size was measured ({stopped})"))
        raise
    handle.update(BenchTable(results, heading))
    png = plot_png(results, title(s, *where, short=True))
    display(BenchPlot(png, "%dist_bench plot: busbw against size, log-log") if png is not None
            else Message("nbdist: no plot: matplotlib is not installed (pip install matplotlib)"))
    return results


# --- on every rank, inside the body ---------------------------------------------------------------
def measure(ops: list[str], sizes: list[int], iters: int, warmup: int, dtype: str,
            sink: list[dict[str, Any]] | None, device: Any) -> None:
    """Time each op at each size on this rank, on ``device``; append each row (every rank's medians) to ``sink``."""
    import torch
    import torch.distributed as dist

    dt = getattr(torch, dtype)
    itemsize = torch.empty((), dtype=dt).element_size()
    n, rank = dist.get_world_size(), dist.get_rank()
    sync = _synchronize(torch, device)
    checker = _checker()
    for op in ops:
        for size in sizes:
            count = element_count(op, size, itemsize, n)
            step = _step(op, count, dt, device, n, rank)
            with _inside(checker, f"%dist_bench {op} {format_size(count * itemsize)}"):
                seconds = _median_seconds(step, iters, warmup, sync)
            del step  # the buffers of this size
            medians: list[Any] = [None] * n
            dist.all_gather_object(medians, seconds)  # nbdist's wrapper: checked like any collective of a cell
            if sink is not None:
                sink.append(row(op, count, itemsize, dtype, [float(m) for m in medians]))


def raw(name: str) -> Callable[..., Any]:
    """torch's own ``torch.distributed.<name>``, under nbdist's wrapper if there is one."""
    import torch.distributed as dist

    fn = getattr(dist, name)
    original: Callable[..., Any] = getattr(fn, "__nbdist_original__", fn)
    return original


def _step(op: str, count: int, dt: Any, device: Any, n: int, rank: int) -> Callable[[], None]:
    """One iteration of ``op`` on fresh buffers of ``count`` elements (S; chunks of S / n where it splits)."""
    import torch
    import torch.distributed as dist

    def zeros(k: int) -> Any:
        return torch.zeros(k, dtype=dt, device=device)

    if op == "all_reduce":
        buf, fn = zeros(count), raw("all_reduce")
        return lambda: fn(buf)
    if op == "broadcast":
        buf, fn = zeros(count), raw("broadcast")
        return lambda: fn(buf, src=0)
    if op == "all_gather":
        out, inp, fn = zeros(count), zeros(count // n), raw("all_gather_into_tensor")
        return lambda: fn(out, inp)
    if op == "reduce_scatter":
        out, inp, fn = zeros(count // n), zeros(count), raw("reduce_scatter_tensor")
        return lambda: fn(out, inp)
    if op == "all_to_all":
        out, inp, fn = zeros(count), zeros(count), raw("all_to_all_single")
        return lambda: fn(out, inp)
    if op == "send_recv":
        send, recv = zeros(count), zeros(count)
        pair = [dist.P2POp(raw("isend"), send, (rank + 1) % n), dist.P2POp(raw("irecv"), recv, (rank - 1) % n)]

        def ring() -> None:
            for work in dist.batch_isend_irecv(pair):
                work.wait()

        return ring
    raise ValueError(f"unknown op {op!r}")


def _synchronize(torch: Any, device: Any) -> Callable[[], None] | None:
    """What waits for the device's queued work (None on CPU, where the collectives return when done)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "npu":
        return lambda: torch.npu.synchronize()
    return None


def _median_seconds(step: Callable[[], None], iters: int, warmup: int, sync: Callable[[], None] | None) -> float:
    for _ in range(warmup):
        step()
    if sync is not None:
        sync()
    times = []
    clock = time.perf_counter
    for _ in range(iters):
        start = clock()
        step()
        if sync is not None:
            sync()
        times.append(clock() - start)
    return statistics.median(times)


def _checker() -> Any:
    """The running cell's fingerprint checker on this kernel (None outside a %%collective body)."""
    from ..cell import hooks

    wrappers = hooks.in_place()
    return None if wrappers is None else wrappers.active


def _inside(checker: Any, what: str) -> contextlib.AbstractContextManager[None]:
    """Tell the cell's watcher the body is inside a collective (it cuts the group on a stop, and names it)."""
    return contextlib.nullcontext() if checker is None else checker.marked(what)
