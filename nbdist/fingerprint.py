"""Collective fingerprints: each collective a %%collective body issues is compared across ranks first.

While the body runs, the collectives of ``torch.distributed`` are wrapped. A
wrapped call publishes its fingerprint (op, shapes, dtypes, device types,
root/src/dst, reduce op, sequence number) and waits until every rank has
published the same sequence number; if any field differs, every rank raises
:class:`CollectiveMismatchError` naming the ranks and the field, instead of
hanging or silently mixing data. Point-to-point calls (send/recv) involve two
ranks only and are not compared.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from .errors import CollectiveMismatchError, PeerFailedError
from .world import World

# op name -> names of its tensor arguments, in order (positional or keyword)
OPS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("tensor",),
    "broadcast": ("tensor",),
    "reduce": ("tensor",),
    "all_gather": ("tensor_list", "tensor"),
    "all_gather_into_tensor": ("output_tensor", "input_tensor"),
    "gather": ("tensor", "gather_list"),
    "scatter": ("tensor", "scatter_list"),
    "reduce_scatter": ("output", "input_list"),
    "reduce_scatter_tensor": ("output", "input"),
    "all_to_all": ("output_tensor_list", "input_tensor_list"),
    "all_to_all_single": ("output", "input"),
    "barrier": (),
    "all_gather_object": (),
    "broadcast_object_list": (),
}
# Arguments that name a root, compared as they are.
ROOTS = ("src", "dst", "group_src", "group_dst")
# Lists whose length, not content, must agree (only the root fills them).
ROOT_ONLY = {"gather_list", "scatter_list"}


def _describe(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."),
                "device": value.device.type}
    if isinstance(value, list | tuple):
        return [_describe(v) for v in value]
    return None if value is None else repr(value)


def fingerprint(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What must match across ranks for this call to be the same collective."""
    names = OPS[op]
    bound = dict(zip(names, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    fp: dict[str, Any] = {"op": op}
    for name in names:
        if name in ROOT_ONLY:
            continue  # filled on the root only; its tensors are checked through the other argument
        if name in bound:
            fp[name] = _describe(bound[name])
    positional_roots = {"broadcast": 1, "reduce": 1, "gather": 2, "scatter": 2, "broadcast_object_list": 1}
    for root in ROOTS:
        if root in kwargs and kwargs[root] is not None:
            fp[root] = kwargs[root]
    if op in positional_roots and len(args) > positional_roots[op]:
        fp["src/dst"] = args[positional_roots[op]]
    reduce_position = {"all_reduce": 1, "reduce": 2, "reduce_scatter": 2, "reduce_scatter_tensor": 2}
    if op in reduce_position:
        pos = reduce_position[op]
        fp["reduce_op"] = str(kwargs.get("op", args[pos] if len(args) > pos else "SUM"))
    if op in ("all_gather_object", "broadcast_object_list") and args:
        fp["object_list_len"] = len(args[0])
    return fp


def differences(fps: list[dict[str, Any]]) -> list[str]:
    """Fields that differ between ranks, each naming which ranks had which value."""
    problems = []
    for field in sorted({k for fp in fps for k in fp} - {"seq"}):
        seen: dict[str, list[int]] = {}
        for rank, fp in enumerate(fps):
            seen.setdefault(json.dumps(fp.get(field, "(absent)")), []).append(rank)
        if len(seen) > 1:
            parts = "; ".join(f"rank(s) {', '.join(map(str, who))}: {json.loads(v)}" for v, who in seen.items())
            problems.append(f"{field} differs ({parts})")
    return problems


class Checker:
    """Wraps torch.distributed's collectives for one cell body; compares each across ranks."""

    def __init__(self, world: World, cell: str, timeout: float, compare: bool = True,
                 on_tick: Callable[[], None] | None = None) -> None:
        self.world, self.cell, self.timeout, self.compare = world, cell, timeout, compare
        self.on_tick = on_tick
        self.count = 0
        self._saved: dict[str, Callable[..., Any]] = {}

    def __enter__(self) -> Checker:
        if self.compare:
            import torch.distributed as dist

            for op in OPS:
                original = getattr(dist, op, None)
                if original is not None:
                    self._saved[op] = original
                    setattr(dist, op, self._wrap(op, original))
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        for op, original in self._saved.items():
            setattr(dist, op, original)
        self._saved.clear()

    def _wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def checked(*args: Any, **kwargs: Any) -> Any:
            self.agree(fingerprint(op, args, kwargs))
            return original(*args, **kwargs)

        return checked

    def agree(self, fp: dict[str, Any]) -> None:
        """Publish this rank's fingerprint for the next collective and compare everyone's."""
        self.count += 1
        seq = self.count
        fp = {**fp, "seq": seq}
        world, client = self.world, self.world.client
        base = f"{self.cell}/fp/{seq}"
        client.set_json(world.key(f"{base}/{world.rank}"), fp)
        label = f"collective #{seq} ({fp['op']}) of this cell"
        world.barrier(base, self.timeout, label, on_tick=lambda: self._peer_finished(seq, fp))
        keys = [world.key(f"{base}/{i}") for i in range(world.world_size)]
        fps = [json.loads(t) for t in client.multi_get(keys)]
        problems = differences(fps)
        if problems:
            raise CollectiveMismatchError(
                f"collective #{seq} of this cell does not match across ranks: {'; '.join(problems)}. "
                "Nothing was sent; fix the cell so every rank issues the same collectives"
            )

    def _peer_finished(self, seq: int, fp: dict[str, Any]) -> None:
        """Fail if a rank ended its body (it published its output) without issuing collective ``seq``."""
        if self.on_tick is not None:
            self.on_tick()
        world = self.world
        for i in range(world.world_size):
            if i == world.rank:
                continue
            done = world.client.get_json_if(world.key(f"{self.cell}/out/{i}"))
            if done is not None and done.get("collectives", 0) < seq:
                raise CollectiveMismatchError(
                    f"{world.describe(i)} finished this cell after {done.get('collectives', 0)} collective(s), but "
                    f"{world.describe(world.rank)} issued #{seq} ({fp['op']}): the ranks run different collectives"
                )


def raise_if_failed(world: World, cell: str) -> None:
    """on_tick helper: stop waiting when another rank already failed this cell."""
    text = world.client.get_if(world.key(f"{cell}/failed"))
    if text is not None:
        info = json.loads(text)
        if info.get("rank") != world.rank:
            raise PeerFailedError(info.get("message", "another rank failed"))
