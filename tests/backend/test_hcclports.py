"""HCCL's port variables, parsed (pure), and the doctor's HCCL checks, run for real on loopback."""

from __future__ import annotations

import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbdist.backend import doctor, hcclports
from nbdist.backend.hcclports import PortSpec, format_ports, host_ports, npu_ports, parse_hccn_ip, parse_range

HOST = "HCCL_HOST_SOCKET_PORT_RANGE"
NPU = "HCCL_NPU_SOCKET_PORT_RANGE"
BASE = "HCCL_IF_BASE_PORT"

# --- the documented forms -----------------------------------------------------------------------------------


def test_auto_means_the_os_picks_and_names_no_port():
    for spec in (host_ports({HOST: "auto"}), npu_ports({NPU: "auto"})):
        assert spec.auto and spec.ports == () and spec.problem is None


def test_a_single_port_names_just_that_port():
    assert host_ports({HOST: "60000"}) == PortSpec(HOST, "60000", ports=(60000,), total=1)


def test_a_range_names_both_ends_and_everything_between():
    spec = host_ports({HOST: "60000-60050"})
    assert spec.ports == tuple(range(60000, 60051)) and spec.total == 51 and not spec.capped


def test_a_list_of_single_ports_keeps_the_order_written():
    assert host_ports({HOST: "56005,56000,56100"}).ports == (56005, 56000, 56100)


def test_a_list_may_mix_ports_and_ranges():
    spec = host_ports({HOST: "60000,60005,61000-61050"})
    assert spec.ports == (60000, 60005, *range(61000, 61051)) and spec.total == 53
    assert spec.label == "HCCL_HOST_SOCKET_PORT_RANGE=60000,60005,61000-61050"


def test_spaces_around_entries_are_tolerated():
    assert parse_range(" 60000 , 60005 - 60007 ") == (60000, 60005, 60006, 60007)


def test_with_nothing_set_the_host_ports_are_cann_defaults_32_from_60000():
    spec = host_ports({})
    assert spec.source == "default" and spec.label == "CANN's default"
    assert spec.ports == tuple(range(60000, 60032)) and spec.problem is None and not spec.auto


def test_empty_values_count_as_unset():
    assert host_ports({HOST: "", BASE: " "}).ports == tuple(range(60000, 60032))
    assert npu_ports({NPU: ""}).ports == (16666,)


def test_the_base_port_moves_the_32_port_block():
    spec = host_ports({BASE: "50000"})
    assert spec.source == BASE and spec.ports == tuple(range(50000, 50032))


def test_a_base_port_near_the_top_stops_at_65535():
    assert host_ports({BASE: "65520"}).ports == tuple(range(65520, 65536))


def test_the_host_range_takes_precedence_over_the_base_port_and_says_so():
    spec = host_ports({HOST: "61000-61001", BASE: "50000"})
    assert spec.source == HOST and spec.ports == (61000, 61001)
    assert spec.note == "HCCL_IF_BASE_PORT=50000 is ignored: HCCL_HOST_SOCKET_PORT_RANGE takes precedence"
    assert host_ports({HOST: "auto", BASE: "50000"}).auto


def test_an_invalid_host_range_is_reported_rather_than_falling_back_to_the_base_port():
    spec = host_ports({HOST: "junk", BASE: "50000"})
    assert spec.ports == () and spec.problem == "HCCL_HOST_SOCKET_PORT_RANGE='junk': 'junk' is not a port or a range"


def test_the_npu_port_defaults_to_16666_and_takes_the_same_forms():
    assert npu_ports({}) == PortSpec("default", ports=(16666,), total=1)
    assert npu_ports({NPU: "61000,61050-61052"}).ports == (61000, 61050, 61051, 61052)
    assert npu_ports({HOST: "1-2", BASE: "50000"}).ports == (16666,)  # the host variables do not move it


def test_a_setting_longer_than_the_cap_keeps_only_the_ports_probed():
    spec = host_ports({HOST: "1025-6024"})
    assert spec.ports == tuple(range(1025, 1025 + hcclports.MAX_PORTS)) and spec.total == 5000 and spec.capped


# --- invalid values -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    ("abc", "'abc' is not a port or a range"),
    ("AUTO", "'AUTO' is not a port or a range"),
    ("60000-", "'60000-' is not a port or a range"),
    ("-5", "'-5' is not a port or a range"),
    ("60000,abc", "'abc' is not a port or a range"),
    ("+5", "'+5' is not a port or a range"),
    ("1_000", "'1_000' is not a port or a range"),
    ("\u0665", "'\u0665' is not a port or a range"),  # an Arabic-Indic five: int() would take it
    ("60000-60010-60020", "'60000-60010-60020' is not a port or a range"),
    ("0", "port 0 is outside 1-65535"),
    ("70000", "port 70000 is outside 1-65535"),
    ("60000-70000", "port 70000 is outside 1-65535"),
    ("60050-60000", "60050-60000 is reversed: write the lower port first (60000-60050)"),
    ("60000,,60005", "'60000,,60005' has an empty entry"),
    ("60000,", "'60000,' has an empty entry"),
    ("60000-60010,60005", "60000-60010 and 60005 overlap at port 60005: CANN forbids overlapping entries"),
    ("60000,60000", "60000 and 60000 overlap at port 60000: CANN forbids overlapping entries"),
])
def test_an_invalid_range_raises_a_readable_value_error_and_becomes_a_problem(value, message):
    with pytest.raises(ValueError) as info:
        parse_range(value)
    assert str(info.value) == message
    for spec, var in ((host_ports({HOST: value}), HOST), (npu_ports({NPU: value}), NPU)):
        assert spec.ports == () and not spec.auto and spec.problem == f"{var}={value!r}: {message}"


@pytest.mark.parametrize(("value", "problem"), [
    ("abc", "HCCL_IF_BASE_PORT='abc': not an integer"),
    ("-1", "HCCL_IF_BASE_PORT='-1': not an integer"),
    ("60000-60031", "HCCL_IF_BASE_PORT='60000-60031': not an integer"),
    ("80", "HCCL_IF_BASE_PORT='80': outside 1024-65520"),
    ("65521", "HCCL_IF_BASE_PORT='65521': outside 1024-65520"),
])
def test_an_invalid_base_port_becomes_a_problem(value, problem):
    spec = host_ports({BASE: value})
    assert spec.source == BASE and spec.ports == () and spec.problem == problem


# --- helpers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ports", "text"), [
    ((), ""),
    ((60000,), "60000"),
    (tuple(range(60000, 60032)), "60000-60031"),
    ((60000, 60005, *range(61000, 61051)), "60000,60005,61000-61050"),
    ((3, 1, 2), "3,1-2"),
])
def test_format_ports_writes_the_variables_own_syntax(ports, text):
    assert format_ports(ports) == text
    if text:
        assert parse_range(text) == ports


def test_the_device_ip_is_read_from_hccn_tools_ipaddr_line():
    assert parse_hccn_ip("ipaddr:192.168.1.8\nnetmask:255.255.255.0\n") == "192.168.1.8"
    assert parse_hccn_ip("  ipaddr : 10.0.0.9\n") == "10.0.0.9"
    assert parse_hccn_ip("netmask:255.255.255.0\n") is None
    assert parse_hccn_ip("Error: device 0 not found\n") is None


# --- the doctor, on loopback --------------------------------------------------------------------------------


@pytest.fixture
def listening_block() -> Iterator[tuple[list[int], int]]:
    """Three listening loopback ports in a row, and the free port right after them."""
    for _ in range(200):
        base = secrets.randbelow(9_000) + 20_000  # below the ephemeral range: nothing takes the closed one
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + 3):
                sockets.append(socket.create_server(("127.0.0.1", port)))
            socket.create_server(("127.0.0.1", base + 3)).close()
        except OSError:
            for s in sockets:
                s.close()
            continue
        try:
            yield [base, base + 1, base + 2], base + 3
        finally:
            for s in sockets:
                s.close()
        return
    raise RuntimeError("no block of four free loopback ports in 20000-28999")


@pytest.fixture
def probed(monkeypatch) -> list[int]:
    """Every port the doctor probes, while the real probe still runs."""
    ports: list[int] = []
    real = doctor.probe

    def recording(host: str, port: int, timeout: float) -> str:
        ports.append(port)
        return real(host, port, timeout)

    monkeypatch.setattr(doctor, "probe", recording)
    return ports


@pytest.fixture
def no_hccn_tool(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))


def checks_by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name.split(" 127.0.0.1")[0]: c for c in checks}


def test_the_doctor_counts_open_and_refused_ports_of_a_list(listening_block, probed, no_hccn_tool):
    opened, closed = listening_block
    value = f"{closed},{opened[0]},{opened[2]}"
    host = checks_by_name(doctor._hccl_port_checks("127.0.0.1", {HOST: value}))["HCCL host ports"]
    assert host.status == "ok", host
    assert host.name == f"HCCL host ports 127.0.0.1:{value}"
    assert host.detail.startswith(f"2 open, 1 refused, 0 filtered ({HOST}={value})"), host
    assert sorted(probed) == sorted([opened[0], opened[2], closed])


def test_the_doctor_probes_the_whole_range(listening_block, probed, no_hccn_tool):
    opened, closed = listening_block
    value = f"{opened[0]}-{closed}"
    host = checks_by_name(doctor._hccl_port_checks("127.0.0.1", {HOST: value}))["HCCL host ports"]
    assert host.status == "ok" and host.detail.startswith("3 open, 1 refused, 0 filtered"), host
    assert sorted(probed) == [*opened, closed]


def test_the_doctor_probes_all_32_default_ports_and_never_16666(probed, no_hccn_tool):
    t0 = time.monotonic()
    checks = checks_by_name(doctor._hccl_port_checks("127.0.0.1", {}))
    assert time.monotonic() - t0 < doctor.PROBE_TIMEOUT + 1.0
    assert sorted(probed) == list(range(60000, 60032)) and 16666 not in probed
    host = checks["HCCL host ports"]
    assert host.name == "HCCL host ports 127.0.0.1:60000-60031" and host.status == "ok", host
    counts = re.match(r"(\d+) open, (\d+) refused, 0 filtered \(CANN's default\)", host.detail)
    assert counts and int(counts[1]) + int(counts[2]) == 32, host
    npu = checks["HCCL NPU port"]
    assert npu.status == "info" and npu.detail.startswith("16666 (CANN's default): it lives on the NPU's own")
    assert "device NIC, RoCE" in npu.detail and "cannot be tested from here" in npu.detail


def test_the_doctor_never_probes_a_configured_npu_port(probed, no_hccn_tool):
    checks = checks_by_name(doctor._hccl_port_checks("127.0.0.1", {HOST: "auto", NPU: "61000-61002"}))
    assert probed == [] and checks["HCCL NPU port"].detail.startswith(f"61000-61002 ({NPU}=61000-61002): ")


def test_auto_is_an_info_line_about_the_ephemeral_range(probed, no_hccn_tool):
    host = checks_by_name(doctor._hccl_port_checks("127.0.0.1", {HOST: "auto"}))["HCCL host ports"]
    assert host.status == "info" and probed == []
    assert host.detail == f"{HOST}=auto: the OS picks them, so there is nothing fixed to probe"
    assert "ephemeral ports" in host.fix and f"{HOST}=60000-60031" in host.fix


def test_a_garbage_value_fails_with_a_fix_and_probes_nothing(probed, no_hccn_tool):
    checks = checks_by_name(doctor._hccl_port_checks("127.0.0.1", {HOST: "60000-6x", NPU: "9-1"}))
    host, npu = checks["HCCL host ports"], checks["HCCL NPU port"]
    assert host.status == "FAIL" and host.detail == f"{HOST}='60000-6x': '60000-6x' is not a port or a range"
    assert host.fix == f"set {HOST} to {hcclports.FORMS}, or unset it"
    assert npu.status == "FAIL" and npu.detail == f"{NPU}='9-1': 9-1 is reversed: write the lower port first (1-9)"
    assert probed == []
    bad_base = checks_by_name(doctor._hccl_port_checks("127.0.0.1", {BASE: "80"}))["HCCL host ports"]
    assert bad_base.status == "FAIL" and bad_base.fix == f"set {BASE} to one integer in 1024-65520, or unset it"


def test_filtered_ports_fail_and_name_the_range_to_open(monkeypatch, no_hccn_tool):
    monkeypatch.setattr(doctor, "probe", lambda host, port, timeout: "timeout" if port % 2 else "refused")
    host = doctor._hccl_port_checks("10.0.0.1", {BASE: "50000"})[0]
    assert host.status == "FAIL", host
    assert host.detail.startswith(f"0 open, 16 refused, 16 filtered ({BASE}=50000)"), host
    assert "no answer from 50001,50003," in host.detail and host.detail.endswith(",50031")
    assert host.fix == "open TCP 50000-50031 on rank 0's host to the other hosts"


def test_32_filtered_ports_cost_one_probe_timeout(monkeypatch, no_hccn_tool):
    monkeypatch.setattr(doctor, "PROBE_TIMEOUT", 0.4)

    def filtered(host: str, port: int, timeout: float) -> str:
        time.sleep(timeout)
        return "timeout"

    monkeypatch.setattr(doctor, "probe", filtered)
    t0 = time.monotonic()
    host = doctor._hccl_port_checks("10.0.0.1", {})[0]
    assert time.monotonic() - t0 < 0.4 * 8  # in parallel: one after another, 32 would take 12.8 s
    assert host.status == "FAIL" and host.detail.startswith("0 open, 0 refused, 32 filtered (CANN's default)"), host
    assert host.fix == "open TCP 60000-60031 on rank 0's host to the other hosts"


def test_a_long_filtered_range_stops_at_the_deadline_and_says_what_was_not_probed(monkeypatch, no_hccn_tool):
    monkeypatch.setattr(doctor, "PROBE_TIMEOUT", 0.3)

    def filtered(host: str, port: int, timeout: float) -> str:
        time.sleep(timeout)
        return "timeout"

    monkeypatch.setattr(doctor, "probe", filtered)
    t0 = time.monotonic()
    host = doctor._hccl_port_checks("10.0.0.1", {HOST: "40000-40299"})[0]
    assert time.monotonic() - t0 < 1.3 + 2.0  # its deadline (1.3 s), not 300 probes' 90 s
    found = re.match(r"0 open, 0 refused, (\d+) filtered, (\d+) not probed within 1.3 s", host.detail)
    assert found and int(found[1]) >= 32 and int(found[1]) + int(found[2]) == 300, host
    assert host.status == "FAIL" and host.fix == "open TCP 40000-40299 on rank 0's host to the other hosts"


def test_a_capped_setting_says_how_many_ports_were_left_out(monkeypatch, no_hccn_tool):
    monkeypatch.setattr(doctor, "probe", lambda host, port, timeout: "refused")
    host = doctor._hccl_port_checks("10.0.0.1", {HOST: "20000-22047"})[0]
    assert host.status == "ok" and host.name == "HCCL host ports 10.0.0.1:20000-21023"
    assert "only the first 1024 of the 2048 ports it names are probed" in host.detail


# --- the device IP, from hccn_tool --------------------------------------------------------------------------


def fake_hccn_tool(directory: Path, body: str) -> Path:
    script = directory / "hccn_tool"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {directory / 'args'}\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def device_ip_check(environ: dict[str, str], **kwargs) -> doctor.Check:
    checks = doctor._hccl_port_checks("127.0.0.1", environ, **kwargs)
    [check] = [c for c in checks if c.name.startswith("HCCL device IP")]
    return check


def test_the_doctor_reports_the_device_ip_hccn_tool_prints(monkeypatch, tmp_path):
    fake_hccn_tool(tmp_path, "echo ipaddr:192.168.100.8\necho netmask:255.255.255.0")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    check = device_ip_check({HOST: "auto"}, device_index=3)
    assert check.name == "HCCL device IP (NPU 3)" and check.status == "info"
    assert check.detail == "192.168.100.8 (hccn_tool -i 3 -ip -g)"
    assert "hccn_tool -i 3 -ping -g address 192.168.100.8" in check.fix
    assert (tmp_path / "args").read_text().split() == ["-i", "3", "-ip", "-g"]


def test_without_hccn_tool_the_device_ip_is_unknown(no_hccn_tool):
    check = device_ip_check({HOST: "auto"})
    assert check.name == "HCCL device IP (NPU 0)" and check.status == "info"
    assert check.detail.startswith("unknown: hccn_tool was found neither on PATH nor in ")


def test_hccn_tool_output_without_an_ip_is_shown_raw(monkeypatch, tmp_path):
    fake_hccn_tool(tmp_path, "echo 'Error: device 0 not found' >&2\nexit 1")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    check = device_ip_check({HOST: "auto"})
    assert check.status == "warn"
    assert check.detail == "`hccn_tool -i 0 -ip -g` printed no ipaddr (exit 1): Error: device 0 not found"


def test_a_hanging_hccn_tool_is_cut_off(monkeypatch, tmp_path):
    fake_hccn_tool(tmp_path, "exec sleep 5")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    check = device_ip_check({HOST: "auto"}, hccn_timeout=0.3)
    assert time.monotonic() - t0 < 4.0  # cut off, not the tool's 5 s
    assert check.status == "warn" and check.detail == "hccn_tool gave no answer within 0.3 s"
