"""Resolving and validating a world's configuration (pure logic)."""

from __future__ import annotations

import pytest

from nbdist.config import DEFAULT_PORT, env_settings, is_local_address, resolve
from nbdist.errors import ConfigError


def test_flags_win_over_the_notebook_namespace_which_wins_over_the_environment():
    env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "1234"}
    ns = {"RANK": 2, "MASTER_ADDR": "127.0.0.1"}
    cfg = resolve({"rank": "3"}, ns, env)
    assert (cfg.rank, cfg.world_size, cfg.master_addr, cfg.master_port) == (3, 4, "127.0.0.1", 1234)


def test_defaults_apply_when_nothing_is_given():
    cfg = resolve({"rank": 0, "world_size": 2, "master_addr": "127.0.0.1"}, {}, {})
    assert cfg.master_port == DEFAULT_PORT and cfg.backend == "auto" and cfg.device is None


def test_empty_environment_values_are_ignored():
    assert env_settings({"RANK": "", "WORLD_SIZE": "2"}) == {"world_size": "2"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"rank": "x", "world_size": 2, "master_addr": "h"}, "--rank must be an integer"),
        ({"rank": 0, "world_size": 2, "master_addr": "h", "backend": "NCCLX"}, "unknown backend"),
        ({"rank": 0, "world_size": 2, "master_addr": " "}, "master address is missing"),
        ({"world_size": 2, "master_addr": "h"}, "rank is missing"),
        ({"rank": 0, "master_addr": "h"}, "world size is missing"),
        ({"rank": -1, "world_size": 2, "master_addr": "h"}, "--rank must be in 0..1"),
        ({"rank": 0, "world_size": 2, "master_addr": "h", "master_port": 0}, "--master-port must be in"),
    ],
)
def test_invalid_values_name_the_flag_to_fix(flags, message):
    with pytest.raises(ConfigError, match=message):
        resolve(flags, {}, {})


def test_loopback_is_local_and_a_documentation_address_is_not():
    assert is_local_address("127.0.0.1")
    assert not is_local_address("203.0.113.1")  # TEST-NET-3: documentation only


def test_nbdist_runs_values_beat_the_notebooks_own_but_not_a_flag():
    from nbdist.config import RUN_VARIABLE, resolve

    environ = {RUN_VARIABLE: '{"RANK": 1, "WORLD_SIZE": 2, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 41000}'}
    namespace = {"RANK": 0, "WORLD_SIZE": 2, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": 29500}
    cfg = resolve({"master_port": 42000}, namespace, environ)
    assert (cfg.rank, cfg.master_addr, cfg.master_port) == (1, "127.0.0.1", 42000)
    assert cfg.sources["rank"] == "nbdist run" and cfg.sources["master_port"] == "--master-port"


def test_a_garbled_nbdist_run_variable_is_a_config_error_naming_it():
    from nbdist.config import RUN_VARIABLE, resolve
    from nbdist.errors import ConfigError

    for raw in ("{not json", "[1, 2]"):
        with pytest.raises(ConfigError, match=RUN_VARIABLE):
            resolve({}, {"RANK": 0, "WORLD_SIZE": 1, "MASTER_ADDR": "127.0.0.1"}, {RUN_VARIABLE: raw})
