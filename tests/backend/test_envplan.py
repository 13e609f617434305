"""Environment plans per backend, from given host facts (pure logic)."""

from __future__ import annotations

import pytest

from nbdist.backend.envplan import agreed_values, as_shell, disagreements, parse_overrides, plan, process_group_timeout
from nbdist.errors import ConfigError
from nbdist.world.netinfo import Route

REMOTE = Route(master_ip="10.202.73.94", local_ip="10.202.73.95", interface="eth0", master_is_local=False)
ON_MASTER = Route(master_ip="10.202.73.94", local_ip="10.202.73.94", interface="eth0", master_is_local=True)
LOCAL = Route(master_ip="127.0.0.1", local_ip="127.0.0.1", interface="lo", master_is_local=True)


def values(variables):
    return {v.key: v.value for v in variables}


def test_hccl_on_a_worker_uses_the_address_that_routes_to_the_master():
    v = values(plan("hccl", REMOTE, {}))
    assert v["HCCL_IF_IP"] == "10.202.73.95"
    assert v["HCCL_CONNECT_TIMEOUT"] == "600" and v["HCCL_WHITELIST_DISABLE"] == "1"
    assert "HCCL_EXEC_TIMEOUT" in v and v["HCCL_IF_BASE_PORT"] is None  # kept: shown, not set
    # Without torch_npu here, both names of the error-handling variable: each release reads one.
    assert v["TORCH_HCCL_ASYNC_ERROR_HANDLING"] == "2" and v["HCCL_ASYNC_ERROR_HANDLING"] == "2"


def test_hccl_on_the_masters_host_uses_the_masters_own_address():
    assert values(plan("hccl", ON_MASTER, {}))["HCCL_IF_IP"] == "10.202.73.94"


def test_gloo_and_nccl_name_the_interface_that_routes_to_the_master():
    assert values(plan("gloo", REMOTE, {}))["GLOO_SOCKET_IFNAME"] == "eth0"
    assert values(plan("gloo", LOCAL, {}))["GLOO_SOCKET_IFNAME"] == "lo"
    nccl = values(plan("nccl", REMOTE, {}))
    assert nccl["NCCL_SOCKET_IFNAME"] == "eth0" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in nccl


def test_values_already_in_the_environment_win_and_are_shown_as_the_users():
    (var,) = [v for v in plan("gloo", REMOTE, {"GLOO_SOCKET_IFNAME": "ens5"})]
    assert (var.value, var.source) == ("ens5", "your environment")


def test_env_flags_override_and_add():
    v = {x.key: x for x in plan("hccl", REMOTE, {"HCCL_CONNECT_TIMEOUT": "900"},
                                {"HCCL_CONNECT_TIMEOUT": "1200", "HCCL_BUFFSIZE": "400"})}
    assert v["HCCL_CONNECT_TIMEOUT"].value == "1200" and v["HCCL_CONNECT_TIMEOUT"].source == "--env"
    assert v["HCCL_BUFFSIZE"].value == "400"


@pytest.mark.parametrize("bad", ["60", "9000", "soon"])
def test_hccl_connect_timeout_is_validated(bad):
    with pytest.raises(ConfigError, match="HCCL_CONNECT_TIMEOUT"):
        plan("hccl", REMOTE, {}, {"HCCL_CONNECT_TIMEOUT": bad})


def test_debug_turns_on_each_backends_diagnostics():
    hccl = values(plan("hccl", REMOTE, {}, debug=True))
    assert hccl["HCCL_ENTRY_LOG_ENABLE"] == "1" and hccl["ASCEND_GLOBAL_LOG_LEVEL"] == "1"
    assert hccl["ASCEND_SLOG_PRINT_TO_STDOUT"] is None and hccl["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert values(plan("hccl", REMOTE, {}, debug="stdout"))["ASCEND_SLOG_PRINT_TO_STDOUT"] == "1"
    assert values(plan("nccl", REMOTE, {}, debug=True))["NCCL_DEBUG"] == "INFO"
    assert "TORCH_DISTRIBUTED_DEBUG" not in values(plan("gloo", REMOTE, {}))


def test_the_process_group_timeout_is_interactive_and_stays_above_hccl_exec_timeout():
    assert process_group_timeout("gloo", plan("gloo", LOCAL, {})) == 300
    hccl = plan("hccl", REMOTE, {}, {"HCCL_EXEC_TIMEOUT": "900"})
    assert process_group_timeout("hccl", hccl) == 960
    with pytest.raises(ConfigError, match="above HCCL_EXEC_TIMEOUT"):
        process_group_timeout("hccl", hccl, requested=100)


def test_disagreeing_values_name_the_ranks_and_values():
    a = {"agreed": agreed_values("hccl", plan("hccl", REMOTE, {}))}
    b = {"agreed": agreed_values("hccl", plan("hccl", REMOTE, {}, {"HCCL_CONNECT_TIMEOUT": "1200"}))}
    c = {"agreed": {"backend": "gloo"}}
    problems = disagreements([a, b, c])
    assert any("HCCL_CONNECT_TIMEOUT differs" in p and "rank 0: 600" in p and "rank 1: 1200" in p
               for p in problems)
    assert any("backend differs" in p and "rank 2: gloo" in p for p in problems)
    assert disagreements([a, a]) == []


def test_overrides_parse_and_reject_malformed_items():
    assert parse_overrides(["A=1", "B_C=x=y"]) == {"A": "1", "B_C": "x=y"}
    with pytest.raises(ConfigError):
        parse_overrides(["novalue"])


def test_the_shell_form_is_sourceable_key_value_lines_with_comments():
    text = as_shell(plan("hccl", REMOTE, {}))
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert "HCCL_IF_IP=10.202.73.95" in lines
    assert all("=" in line and " " not in line.split("=", 1)[0] for line in lines)
