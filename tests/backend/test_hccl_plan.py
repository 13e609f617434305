"""The HCCL path as torch_npu and CANN document it: facts of the Ascend stack, and the plan made from them.

Pure logic, from given facts: no NPU is available to run any of it. Each rule cites its source in the
code (nbdist/backend/ascend.py, nbdist/backend/envplan.py).
"""

from __future__ import annotations

import pytest

from nbdist.backend import ascend
from nbdist.backend.ascend import A1, A2, A3, NEW_ERROR_VAR, OLD_ERROR_VAR, Facts
from nbdist.backend.envplan import READ_ONCE, agreed_values, disagreements, early, plan, process_group_timeout, stale
from nbdist.config import validate as validate_config
from nbdist.errors import ConfigError
from nbdist.world.netinfo import Route

REMOTE = Route(master_ip="10.202.73.94", local_ip="10.202.73.95", interface="eth0", master_is_local=False)

# What nbdist learns of each release (ascend.error_variables decides it from the installed library).
NPU_213 = Facts(torch_npu="2.13.0", error_var=(NEW_ERROR_VAR,), error_var_why="torch_npu 2.13.0 reads the new name",
                cann="8.3.RC1", chip="910B3", family=A2, devices=1)
NPU_212 = Facts(torch_npu="2.12.0", error_var=(OLD_ERROR_VAR,), error_var_why="torch_npu 2.12.0 reads the old name",
                cann="8.2.RC1", chip="910B3", family=A2, devices=1)


def by_key(variables):
    return {v.key: v for v in variables}


# --- facts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("chip", "family"), [
    ("910B3", A2), ("Ascend910B4", A2), ("910B4-1", A2), ("910B2C", A2),
    ("910A", A1), ("Ascend910ProB", A1), ("910PremiumA", A1), ("Ascend910B", A1),  # a bare 910B is first-gen
    ("Ascend910_9392", A3), ("Ascend910", A3),
    ("310P3", None), ("", None), (None, None),
])
def test_the_product_family_follows_torch_npus_soc_table(chip, family):
    assert ascend.family_of(chip) == family


def test_the_installed_library_says_which_error_variable_this_torch_npu_reads(tmp_path):
    new = tmp_path / "new.so"
    new.write_bytes(b"\x7fELF...HCCL_ASYNC_ERROR_HANDLING\0...TORCH_HCCL_ASYNC_ERROR_HANDLING\0...")
    old = tmp_path / "old.so"
    old.write_bytes(b"\x7fELF...\0HCCL_ASYNC_ERROR_HANDLING\0...")
    assert ascend.error_variables("2.12.0", new)[0] == (NEW_ERROR_VAR,)  # a 26.2.0 build for torch 2.12
    assert ascend.error_variables("2.12.0", old)[0] == (OLD_ERROR_VAR,)
    # Without a library to read: the 2.13 line is new; before it, the release is unknown, so both.
    assert ascend.error_variables("2.13.0", None)[0] == (NEW_ERROR_VAR,)
    assert ascend.error_variables("2.12.0", None)[0] == (NEW_ERROR_VAR, OLD_ERROR_VAR)
    assert ascend.error_variables(None, None)[0] == (NEW_ERROR_VAR, OLD_ERROR_VAR)


def test_torch_npus_own_package_check_is_foreseen(tmp_path):
    home = tmp_path / "latest"
    assert ascend.package_problem({}) is None  # ASCEND_HOME_PATH unset: torch_npu only warns
    assert "does not exist" in ascend.package_problem({"ASCEND_HOME_PATH": str(home)})
    home.mkdir()
    assert "ASCEND_OPP_PATH is not" in ascend.package_problem({"ASCEND_HOME_PATH": str(home)})
    env = {"ASCEND_HOME_PATH": str(home), "ASCEND_OPP_PATH": str(home / "opp")}
    assert "ASCEND_OPP_PATH is" in ascend.package_problem(env) and "does not exist" in ascend.package_problem(env)
    (home / "opp").mkdir()
    assert "runtime" in ascend.package_problem(env)
    (home / "runtime").mkdir()
    assert "compiler" in ascend.package_problem(env)
    (home / "compiler").mkdir()
    assert ascend.package_problem(env) is None


def test_the_cann_version_is_read_from_its_install_info(tmp_path):
    assert ascend.cann_version({"ASCEND_HOME_PATH": str(tmp_path / "none")}) is None
    (tmp_path / "aarch64-linux").mkdir()
    (tmp_path / "aarch64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.3.RC1\ninnerversion=V100R001C23\n")
    assert ascend.cann_version({"ASCEND_HOME_PATH": str(tmp_path)}) == "8.3.RC1"


# --- error handling -----------------------------------------------------------------------------------


def test_the_plan_sets_the_error_variable_the_installed_torch_npu_reads_to_abort_and_raise():
    v213 = by_key(plan("hccl", REMOTE, {}, npu=NPU_213))
    assert v213[NEW_ERROR_VAR].value == "2" and OLD_ERROR_VAR not in v213
    assert "raise in the cell" in v213[NEW_ERROR_VAR].why and "2.13.0" in v213[NEW_ERROR_VAR].why
    v212 = by_key(plan("hccl", REMOTE, {}, npu=NPU_212))
    assert v212[OLD_ERROR_VAR].value == "2" and NEW_ERROR_VAR not in v212
    unknown = by_key(plan("hccl", REMOTE, {}))
    assert unknown[NEW_ERROR_VAR].value == unknown[OLD_ERROR_VAR].value == "2"
    assert not any(v.warning for v in unknown.values())
    assert NEW_ERROR_VAR not in by_key(plan("gloo", REMOTE, {}, npu=NPU_213))


def test_either_name_is_accepted_in_env_and_a_warning_comes_only_when_it_is_not_the_one_read():
    same = by_key(plan("hccl", REMOTE, {}, {NEW_ERROR_VAR: "2"}, npu=NPU_213))
    assert same[NEW_ERROR_VAR].source == "--env" and not same[NEW_ERROR_VAR].warning
    other = by_key(plan("hccl", REMOTE, {}, {OLD_ERROR_VAR: "2"}, npu=NPU_213))
    # Carried over to the name torch_npu 2.13 reads, and the other name is kept as given, with a warning.
    assert other[NEW_ERROR_VAR].value == "2" and other[NEW_ERROR_VAR].source == "--env"
    assert other[OLD_ERROR_VAR].value == "2" and "not the name torch_npu 2.13.0 reads" in other[OLD_ERROR_VAR].warning
    old = by_key(plan("hccl", REMOTE, {}, {NEW_ERROR_VAR: "2"}, npu=NPU_212))
    assert old[OLD_ERROR_VAR].value == "2" and "not the name torch_npu 2.12.0 reads" in old[NEW_ERROR_VAR].warning
    # From the environment, too.
    env = by_key(plan("hccl", REMOTE, {OLD_ERROR_VAR: "2"}, npu=NPU_212))
    assert env[OLD_ERROR_VAR].source == "your environment" and not env[OLD_ERROR_VAR].warning


def test_an_error_mode_that_kills_the_kernel_is_warned_about_and_an_unknown_one_refused():
    (var,) = [v for v in plan("hccl", REMOTE, {}, {NEW_ERROR_VAR: "1"}, npu=NPU_213) if v.key == NEW_ERROR_VAR]
    assert var.value == "1" and "take the whole kernel down" in var.warning
    (var,) = [v for v in plan("hccl", REMOTE, {}, {NEW_ERROR_VAR: "0"}, npu=NPU_213) if v.key == NEW_ERROR_VAR]
    assert "never aborted" in var.warning
    with pytest.raises(ConfigError, match=f"{NEW_ERROR_VAR} must be in 0..3"):
        plan("hccl", REMOTE, {}, {NEW_ERROR_VAR: "4"}, npu=NPU_213)


# --- timeouts ----------------------------------------------------------------------------------------


def test_hccl_exec_timeout_is_validated_per_product_family():
    a1 = Facts(family=A1)
    assert by_key(plan("hccl", REMOTE, {}, {"HCCL_EXEC_TIMEOUT": "100000"}, npu=NPU_213))["HCCL_EXEC_TIMEOUT"]
    with pytest.raises(ConfigError, match=r"HCCL_EXEC_TIMEOUT must be in 1\.\.17340"):
        plan("hccl", REMOTE, {}, {"HCCL_EXEC_TIMEOUT": "17341"}, npu=a1)
    # First-generation products round down to a multiple of 68 s: the plan says what HCCL will use.
    assert "272 s" in by_key(plan("hccl", REMOTE, {}, npu=a1))["HCCL_EXEC_TIMEOUT"].why
    with pytest.raises(ConfigError, match=r"HCCL_EXEC_TIMEOUT must be in 1\.\.2147483647"):
        plan("hccl", REMOTE, {}, {"HCCL_EXEC_TIMEOUT": "2147483648"})  # family unknown: the A2 range


@pytest.mark.parametrize("npu", [NPU_213, Facts(family=A1), Facts()], ids=["A2", "first-gen", "unknown"])
def test_hccl_exec_timeout_zero_is_refused_for_notebooks_with_the_reason(npu):
    with pytest.raises(ConfigError, match="never ends on the NPU") as info:
        plan("hccl", REMOTE, {}, {"HCCL_EXEC_TIMEOUT": "0"}, npu=npu)
    assert "choose a number of seconds" in str(info.value)


def test_the_process_group_timeout_stays_above_both_hccl_timeouts():
    assert process_group_timeout("hccl", plan("hccl", REMOTE, {}, npu=NPU_213)) == 660  # 600 + 60
    longer = plan("hccl", REMOTE, {}, {"HCCL_CONNECT_TIMEOUT": "1200"}, npu=NPU_213)
    assert process_group_timeout("hccl", longer) == 1260
    assert process_group_timeout("hccl", longer, requested=2000) == 2000
    with pytest.raises(ConfigError, match=r"above HCCL_CONNECT_TIMEOUT \(1200 s\).*at least 1260"):
        process_group_timeout("hccl", longer, requested=700)
    assert process_group_timeout("gloo", plan("gloo", REMOTE, {})) == 300


# --- timing -------------------------------------------------------------------------------------------


def test_the_early_plan_holds_what_does_not_depend_on_the_master_and_the_users_values_win():
    keys = by_key(early({}, NPU_213))
    assert set(keys) == {"HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_WHITELIST_DISABLE", NEW_ERROR_VAR}
    assert keys[NEW_ERROR_VAR].value == "2"
    mine = by_key(early({"HCCL_EXEC_TIMEOUT": "900"}, NPU_213))["HCCL_EXEC_TIMEOUT"]
    assert (mine.value, mine.source) == ("900", "your environment")


def test_values_torch_npu_read_once_before_are_named_as_stale():
    variables = plan("hccl", REMOTE, {}, npu=NPU_213)
    assert stale(variables, None) == []
    seen = {key: None for key in READ_ONCE}
    late = stale(variables, seen)
    assert any(s.startswith("HCCL_EXEC_TIMEOUT=300 (torch_npu keeps its default)") for s in late), late
    assert any(s.startswith(f"{NEW_ERROR_VAR}=2") for s in late)
    assert stale(variables, {"HCCL_EXEC_TIMEOUT": "300", NEW_ERROR_VAR: "2"}) == []
    assert stale(variables, {"HCCL_EXEC_TIMEOUT": "900", NEW_ERROR_VAR: "2"}) == [
        "HCCL_EXEC_TIMEOUT=300 (torch_npu keeps 900)"]


# --- agreement and debug ------------------------------------------------------------------------------


def test_ranks_on_different_cann_or_torch_npu_versions_are_refused_with_both_versions_named():
    a = {"agreed": agreed_values("hccl", plan("hccl", REMOTE, {}, npu=NPU_213), NPU_213)}
    b = {"agreed": agreed_values("hccl", plan("hccl", REMOTE, {}, npu=NPU_212), NPU_212)}
    problems = disagreements([a, b])
    assert any("CANN version differs" in p and "8.3.RC1" in p and "8.2.RC1" in p for p in problems), problems
    assert any("torch_npu version differs" in p and "2.13.0" in p and "2.12.0" in p for p in problems)
    assert disagreements([a, a]) == []
    # Not compared for other backends: a CPU rank without torch_npu may join a gloo world.
    assert "CANN version" not in agreed_values("gloo", [], NPU_213)


def test_debug_keeps_canns_log_files_unless_stdout_is_asked_for():
    files = by_key(plan("hccl", REMOTE, {}, debug="files", npu=NPU_213))
    shown = files["ASCEND_SLOG_PRINT_TO_STDOUT"]
    assert shown.value is None and "log files" in shown.why
    stdout = by_key(plan("hccl", REMOTE, {}, debug="stdout", npu=NPU_213))
    assert stdout["ASCEND_SLOG_PRINT_TO_STDOUT"].value == "1"
    assert "writes no log files" in stdout["ASCEND_SLOG_PRINT_TO_STDOUT"].why
    assert validate_config(rank=0, world_size=1, master_addr="a", debug=True).debug == "files"
    with pytest.raises(ConfigError, match="--debug takes files"):
        validate_config(rank=0, world_size=1, master_addr="a", debug="loud")


def test_port_ranges_given_with_env_are_checked_in_every_documented_form():
    for good in ("auto", "60000", "60000-60050", "60000,60050-60100,60150-60160"):
        assert by_key(plan("hccl", REMOTE, {}, {"HCCL_HOST_SOCKET_PORT_RANGE": good}))
        assert by_key(plan("hccl", REMOTE, {}, {"HCCL_NPU_SOCKET_PORT_RANGE": good}))
    with pytest.raises(ConfigError, match="HCCL_NPU_SOCKET_PORT_RANGE: .*reversed"):
        plan("hccl", REMOTE, {}, {"HCCL_NPU_SOCKET_PORT_RANGE": "61050-61000"})
    with pytest.raises(ConfigError, match="HCCL_HOST_SOCKET_PORT_RANGE: .*overlap"):
        plan("hccl", REMOTE, {}, {"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60010,60005"})
