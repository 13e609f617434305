"""Pure logic behind cutting and trusting process groups, and comparing collectives (no kernel needed)."""

from __future__ import annotations

import json
import os
import socket
import struct

from nbdist.backend.procgroup import gloo_listeners, verdict
from nbdist.cell.fingerprint import differences
from nbdist.world.netinfo import decode_endpoint


def _sockaddr(ip: str, port: int) -> bytes:
    """A sockaddr_storage (128 bytes) as Linux lays it out, then gloo's ssize_t sequence number."""
    if ":" in ip:
        raw = struct.pack("=H", socket.AF_INET6) + struct.pack("!H", port) + bytes(4) + socket.inet_pton(
            socket.AF_INET6, ip)
    else:
        raw = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_pton(socket.AF_INET, ip)
    return raw + os.urandom(128 - len(raw)) + struct.pack("=q", -1)  # the rest is whatever the stack held


def test_gloo_rank_records_name_the_listener():
    host = b"notebook-a"
    address = _sockaddr("10.202.73.94", 41813)
    record = struct.pack("=Q", len(host)) + host + struct.pack("=Q", len(address)) + address
    record += struct.pack("=qq", 3, 4)  # pair ids
    assert gloo_listeners(record) == {("10.202.73.94", 41813)}
    v6 = _sockaddr("fd00::2", 60001)
    assert gloo_listeners(struct.pack("=Q", 1) + b"h" + struct.pack("=Q", len(v6)) + v6) == {("fd00::2", 60001)}


def test_the_older_gloo_layout_one_address_per_peer_is_read_too():
    value = _sockaddr("127.0.0.1", 1111) + _sockaddr("127.0.0.1", 1111) + _sockaddr("127.0.0.1", 2222)
    assert gloo_listeners(value) == {("127.0.0.1", 1111), ("127.0.0.1", 2222)}


def test_values_that_are_not_gloo_addresses_give_nothing():
    assert gloo_listeners(json.dumps({"hash": "x" * 200}).encode()) == set()
    assert gloo_listeners(os.urandom(4108)) == set()  # HCCL's root info is 4108 bytes
    assert gloo_listeners(b"") == set()


def test_proc_net_tcp_endpoints_decode():
    assert decode_endpoint("0100007F:A5F1") == ("127.0.0.1", 42481)
    assert decode_endpoint("00000000000000000000000001000000:1F90") == ("::1", 8080)
    assert decode_endpoint("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)  # IPv4-mapped


def _state(calls: dict[str, int], seq: dict[str, int] | None = None, groups: tuple[str, ...] = ("0",)) -> dict:
    return {"ok": True, "groups": list(groups), "calls": calls, "seq": calls if seq is None else seq}


def test_groups_that_issued_the_same_collectives_are_trusted():
    assert verdict({0: _state({"0": 3}), 1: _state({"0": 3})}) is None
    assert verdict({0: _state({}), 1: _state({})}) is None  # nothing issued: nothing in flight


def test_a_cut_destroyed_or_missing_group_is_not_trusted():
    assert verdict({0: _state({"0": 3}), 1: {"ok": False, "why": "cut"}}) == "rank 1: cut"
    assert verdict({0: _state({"0": 3}), 1: None}) == "rank 1 sent no state"


def test_different_collective_counts_are_not_trusted_and_the_message_says_who_issued_what():
    why = verdict({0: _state({"0": 4}), 1: _state({"0": 3})})
    assert why == "the ranks issued different numbers of collectives on the default group (rank 0: 4; rank 1: 3)"
    # DDP's collectives are seen only by the backend's count.
    why = verdict({0: _state({"0": 1}, {"0": 9}), 1: _state({"0": 1}, {"0": 8})})
    assert why is not None and "the backend's count" in why


def test_only_a_groups_members_are_compared():
    pair = ("0", "1")
    states = {0: _state({"0": 1, "1": 2}, groups=pair), 1: _state({"0": 1, "1": 2}, groups=pair),
              2: _state({"0": 1})}
    assert verdict(states) is None
    states[1] = _state({"0": 1, "1": 1}, groups=pair)
    assert "group 1 (rank 0: 2; rank 1: 1)" in verdict(states)


def _tensor(shape, dtype="float32", device="cpu"):
    return {"shape": shape, "dtype": dtype, "device": device}


def test_mismatches_read_field_by_field():
    fps = {0: {"op": "all_reduce", "tensor": _tensor([2]), "reduce_op": "SUM"},
           1: {"op": "all_reduce", "tensor": _tensor([3]), "reduce_op": "SUM"}}
    assert differences(fps) == ["tensor differs (rank 0: shape [2]; rank 1: shape [3])"]
    fps[1]["tensor"] = _tensor([2], dtype="float64")
    assert differences(fps) == ["tensor differs (rank 0: dtype float32; rank 1: dtype float64)"]
    fps[1] = {"op": "all_reduce", "tensor": _tensor([2]), "reduce_op": "MAX"}
    assert differences(fps) == ["reduce_op differs (rank 0: SUM; rank 1: MAX)"]


def test_mismatched_tensor_lists_name_the_element_or_the_length():
    a = {"op": "all_gather", "tensor_list": [_tensor([1]), _tensor([1])], "tensor": _tensor([1])}
    b = {"op": "all_gather", "tensor_list": [_tensor([1]), _tensor([4])], "tensor": _tensor([1])}
    assert differences({0: a, 1: b}) == ["tensor_list differs (rank 0: [1] shape [1]; rank 1: [1] shape [4])"]
    c = {**a, "tensor_list": [_tensor([1])] * 3}
    assert differences({0: a, 1: c}) == ["tensor_list differs (rank 0: 2 tensor(s); rank 1: 3 tensor(s))"]


def test_ranks_with_the_same_value_are_grouped():
    fps = {r: {"op": "broadcast", "tensor": _tensor([4]), "src": 0 if r < 3 else 1} for r in range(4)}
    assert differences(fps) == ["src differs (ranks 0-2: 0; rank 3: 1)"]
