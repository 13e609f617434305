"""The notebook's own init_process_group in a formed world: a no-op where it agrees, one error where it does not
(nbdist.backend.userinit, no kernel)."""

from __future__ import annotations

import inspect

import pytest
import torch.distributed as dist

from nbdist.backend import userinit
from nbdist.errors import InitProcessGroupError, NbdistError

PARAMS = list(inspect.signature(dist.init_process_group).parameters)
WORLD = userinit.Formed("gloo", 1, 2, "rank 1 (node-a, pid 4242)")


def call(*args, **kwargs) -> userinit.Asked:
    return userinit.asked(PARAMS, args, kwargs)


@pytest.mark.parametrize(("args", "kwargs"), [
    (("gloo",), {"rank": 1, "world_size": 2}),  # the tutorials' setup(rank, world_size)
    ((), {"backend": "gloo", "init_method": "env://", "rank": 1, "world_size": 2}),
    ((), {}),  # everything left out agrees
    ((None,), {"rank": -1, "world_size": -1}),  # torch's own "not given"
    (("GLOO",), {}),
    ((dist.Backend.GLOO,), {"rank": 1}),
    (("cpu:gloo",), {"world_size": 2}),
    (("gloo", "tcp://localhost:12355"), {"rank": 1, "world_size": 2, "store": object(), "timeout": 5}),
])
def test_a_call_that_agrees_with_the_world_is_accepted(args, kwargs):
    assert userinit.decide(call(*args, **kwargs), WORLD) is None


def test_the_accepted_line_names_the_call_and_the_world_on_one_line():
    line = userinit.accepted(call("gloo", rank=1, world_size=2), WORLD)
    assert line == ("nbdist: init_process_group('gloo', rank=1, world_size=2) ignored: this notebook is already "
                    "rank 1 of a 2-rank gloo world")
    noted = userinit.accepted(call(), WORLD, "the group was built again")
    assert "\n" not in noted and noted.endswith("world; the group was built again")


def test_arguments_nbdist_does_not_use_show_as_dots():
    assert call("gloo", init_method="env://", rank=1).call() == "init_process_group('gloo', rank=1, ...)"
    assert call().call() == "init_process_group()"


@pytest.mark.parametrize(("args", "kwargs", "difference"), [
    (("nccl",), {"rank": 1, "world_size": 2}, "backend nccl, but the world uses gloo"),
    (("hccl",), {}, "backend hccl, but the world uses gloo"),
    (("cpu:gloo,cuda:nccl",), {}, "backend cpu:gloo,cuda:nccl, but the world uses gloo only"),
    (("gloo",), {"rank": 0, "world_size": 2}, "rank 0, but this notebook is rank 1"),
    (("gloo",), {"rank": 1, "world_size": 4}, "world_size 4, but the world has 2 ranks"),
    ((), {"rank": "one"}, "rank one, but this notebook is rank 1"),
])
def test_a_call_that_differs_is_refused_naming_the_difference(args, kwargs, difference):
    message = userinit.decide(call(*args, **kwargs), WORLD)
    assert message is not None and difference in message
    assert "rank 1 (node-a, pid 4242)" in message and "%%dist_init" in message


def test_every_difference_is_named_in_one_message():
    message = userinit.decide(call("nccl", rank=0, world_size=3), WORLD)
    assert message is not None
    assert message.startswith("init_process_group('nccl', rank=0, world_size=3): backend nccl, but the world uses "
                              "gloo; rank 0, but this notebook is rank 1; world_size 3, but the world has 2 ranks.")
    assert "re-run %%dist_init with --backend nccl" in message


def test_the_error_is_an_nbdist_error_and_a_value_error_shown_as_one_line():
    error = InitProcessGroupError("init_process_group('nccl'): backend nccl, but the world uses gloo")
    assert isinstance(error, NbdistError) and isinstance(error, ValueError)
    assert error._render_traceback_() == [f"InitProcessGroupError: {error}"]


def test_in_place_it_answers_for_torch_and_leaves_nbdists_own_calls_to_torch(capsys):
    torchs = dist.init_process_group
    restored: list[bool] = []
    patch = userinit.UserInit()
    patch.install(lambda: WORLD, lambda: restored.append(True) or None)
    try:
        assert dist.init_process_group is not torchs and dist.distributed_c10d.init_process_group is not torchs
        assert userinit.real() is torchs  # what nbdist's own groups are built with
        dist.init_process_group("gloo", rank=1, world_size=2)
        assert restored == [True] and not dist.is_initialized()
        assert capsys.readouterr().err == ("nbdist: init_process_group('gloo', rank=1, world_size=2) ignored: this "
                                           "notebook is already rank 1 of a 2-rank gloo world\n")
        with pytest.raises(InitProcessGroupError, match="backend nccl, but the world uses gloo"):
            dist.distributed_c10d.init_process_group(backend="nccl")
        assert restored == [True]  # a refused call touches nothing
        patch.install(lambda: WORLD, lambda: None)  # idempotent: one stand-in
        assert userinit.real() is torchs
    finally:
        patch.uninstall()
    assert dist.init_process_group is torchs and dist.distributed_c10d.init_process_group is torchs
    patch.uninstall()  # idempotent
    assert dist.init_process_group is torchs
