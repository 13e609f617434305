"""The check's quick digest (:func:`nbdist.diverge.hashing.quick`): equal leaves give equal digests, and any change
a replica can undergo (a value, an order, a name, a shape, a setting) gives another."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nbdist.diverge import hashing  # noqa: E402


def leaves_of(model: object, opt: object | None = None) -> list[tuple[str, object]]:
    found = list(hashing.leaves(model))
    if opt is not None:
        found += list(hashing.leaves(opt, hashing.param_names([model])))
    return found


def trained() -> tuple[object, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    return model, opt


def test_equal_replicas_built_apart_give_equal_digests() -> None:
    (a, opt_a), (b, opt_b) = trained(), trained()
    assert hashing.quick(leaves_of(a, opt_a)) == hashing.quick(leaves_of(b, opt_b))


def test_one_bit_of_one_element_changes_the_digest() -> None:
    model, opt = trained()
    before = hashing.quick(leaves_of(model, opt))
    with torch.no_grad():
        words = model[2].bias.view(torch.int32)
        words[1] ^= 1
    assert hashing.quick(leaves_of(model, opt)) != before


def test_two_elements_swapped_change_the_digest() -> None:
    t = torch.arange(1000, dtype=torch.float32)
    swapped = t.clone()
    swapped[[10, 900]] = swapped[[900, 10]]
    assert hashing.quick([("w", t)]) != hashing.quick([("w", swapped)])


def test_the_optimizers_state_and_settings_count() -> None:
    model, opt = trained()
    before = hashing.quick(leaves_of(model, opt))
    opt.param_groups[0]["lr"] = 2e-3
    assert hashing.quick(leaves_of(model, opt)) != before
    opt.param_groups[0]["lr"] = 1e-3
    assert hashing.quick(leaves_of(model, opt)) == before
    state = next(iter(opt.state.values()))
    state["exp_avg"].add_(1e-6)
    assert hashing.quick(leaves_of(model, opt)) != before


@pytest.mark.parametrize("a, b", [
    ([("w", torch.zeros(6))], [("v", torch.zeros(6))]),  # another name
    ([("w", torch.zeros(6))], [("w", torch.zeros(2, 3))]),  # another shape
    ([("w", torch.zeros(6))], [("w", torch.zeros(6, dtype=torch.float64))]),  # another dtype
    ([("w", torch.zeros(3, dtype=torch.int8))], [("w", torch.ones(3, dtype=torch.int8))]),  # not whole words
    ([("lr", 0.1)], [("lr", 0.2)]),
    ([("lr", 1)], [("lr", "1")]),
])
def test_what_differs_in_name_shape_type_or_value_gives_another_digest(a, b) -> None:  # type: ignore[no-untyped-def]
    assert hashing.quick(a) != hashing.quick(b)


def test_a_strided_view_digests_as_its_contiguous_copy() -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert hashing.quick([("w", t.t())]) == hashing.quick([("w", t.t().contiguous())])


def test_a_run_longer_than_any_before_grows_the_weights_with_the_same_numbers() -> None:
    short = torch.arange(10, dtype=torch.int32)
    first = hashing.quick([("w", short)])
    hashing.quick([("w", torch.zeros(200_000, dtype=torch.int32))])  # weights grown past their first length
    assert hashing.quick([("w", short)]) == first


def test_a_parameter_given_new_data_is_digested_from_its_new_data() -> None:
    # a loop's second check reuses the first's view of each tensor's words, while the tensor's data stays put
    model, opt = trained()
    weight = model[0].weight
    before = hashing.quick(leaves_of(model, opt))
    weight.data = weight.data.clone()  # the same tensor, new storage, equal values
    assert hashing.quick(leaves_of(model, opt)) == before
    with torch.no_grad():
        weight.add_(1.0)  # in the new storage: the view kept from the first check would not see it
    assert hashing.quick(leaves_of(model, opt)) != before


def test_a_strided_leaf_checked_again_sees_its_change() -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    leaf = t.t()
    before = hashing.quick([("w", leaf)])
    t[0, 0] = 100.0
    assert hashing.quick([("w", leaf)]) != before


def test_the_check_gathers_where_the_first_tensor_lives_whatever_the_value_is() -> None:
    """check_replicas takes a model, a tensor or a state dict: off gloo, its numbers go where the first tensor is
    (a tensor has no parameters(): it raised AttributeError); gloo gathers on the CPU."""
    from nbdist.diverge.replicas import gathered_on, replica_leaves

    model, opt = trained()
    on_meta = torch.ones(3, device="meta")  # a device that is not the CPU, on any machine
    assert gathered_on("nccl", replica_leaves(on_meta)) == torch.device("meta")
    assert gathered_on("hccl", replica_leaves({"w": on_meta, "lr": 0.1})) == torch.device("meta")
    assert gathered_on("nccl", replica_leaves(model, opt)) == next(model.parameters()).device
    assert gathered_on("nccl", replica_leaves({"lr": 0.1})) == torch.device("cpu")
    assert gathered_on("gloo", replica_leaves(on_meta)) == torch.device("cpu")


def test_the_leaves_name_the_optimizers_state_by_the_models_parameters_as_one_walk_of_each_did() -> None:
    """replica_leaves names the optimizer's state from the module's own leaves, where it walked the module twice."""
    from nbdist.diverge.replicas import replica_leaves

    model, opt = trained()
    shared = torch.nn.Sequential(model, torch.nn.Sequential(model[0]))  # a layer under two names: the first wins
    for m in (model, shared):
        walked_twice = list(hashing.leaves(m)) + [
            (f"optimizer.{name}", leaf) for name, leaf in hashing.leaves(opt, hashing.param_names([m]))]
        assert replica_leaves(m, opt) == walked_twice


def test_the_calls_are_counted_per_model_while_it_lives() -> None:
    """A loop's calls count per model; a model gone takes its count with it (a new one at its id starts again), and
    a plain dict, which nothing tells apart from a later one at its id, is refused with what to do instead."""
    from nbdist.diverge import replicas
    from nbdist.errors import ConfigError

    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    for _ in range(3):
        replicas._counted(a)[0] += 1
    replicas._counted(b)[0] += 1
    assert (replicas._counted(a)[0], replicas._counted(b)[0]) == (3, 1)
    gone = id(a)
    del a
    assert gone not in replicas._STEPS
    with pytest.raises(ConfigError, match="a dict cannot be followed from call to call: pass the module"):
        replicas.check_replicas({"w": torch.ones(2)})
