"""Signed cells (pure logic): what verifies, what is refused and why, the local key's file."""

from __future__ import annotations

import os
import stat

import pytest

from nbdist.world import signing

DRIVER = {"rank": 0, "session": "s0"}


def cell(**changes):
    fields = {"round": 3, "seq": 7, "driver": 0, "session": "s0", "kind": "collective", "source": "x = 1",
              "flags": {"timeout": 300.0}, "gen": 0, "number": 5, "t": 1.0}
    return {**fields, **changes}


def check(signed, **expect):
    want = {"round_": 3, "seq": 7, "driver": DRIVER, **expect}
    return signing.verify(signing.key_from("secret"), signed, **want)


def test_a_cell_signed_with_the_worlds_key_verifies_and_the_key_is_not_the_secret():
    key = signing.key_from("secret")
    assert key != b"secret" and len(key) == 32
    assert check(signing.sign(key, cell())) is None


@pytest.mark.parametrize("field,value", [("source", "import os; os.system('x')"), ("flags", {"timeout": 1.0}),
                                         ("round", 4), ("seq", 8), ("driver", 1), ("session", "s1"),
                                         ("kind", "release"), ("gen", 1), ("number", 6)])
def test_changing_any_signed_field_breaks_the_signature(field, value):
    signed = signing.sign(signing.key_from("secret"), cell())
    assert "signature does not verify" in check({**signed, field: value})


def test_another_key_or_no_signature_is_refused():
    assert "signature" in check(signing.sign(signing.key_from("other"), cell()))
    assert "signature" in check(cell())
    assert "signature" in check({**cell(), "sig": 12})


def test_a_genuine_cell_of_another_round_sequence_or_driver_is_refused_as_such():
    signed = signing.sign(signing.key_from("secret"), cell())
    assert "signed for world round 3" in check(signed, round_=4) and "replay" in check(signed, round_=4)
    assert "sequence number 7 where 8 was due" in check(signed, seq=8)
    assert "rank 1 drives this world" in check(signed, driver={"rank": 1, "session": "s1"})
    assert "another kernel of rank 0" in check(signed, driver={"rank": 0, "session": "a replaced kernel"})


def test_the_local_key_file_is_this_users_only_and_names_the_servers_port_and_pid(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    path = signing.create_local_key(29999)
    try:
        assert path == signing.local_key_path(29999, os.getpid())
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        secret = open(path).read()
        assert len(secret) == 64
        import socket

        marker = {"host": socket.gethostname(), "pid": os.getpid()}
        assert signing.world_secret(None, "127.0.0.1", 29999, marker) == secret
        assert signing.world_secret("tok", "10.1.2.3", 29999, marker) == "tok"
        with pytest.raises(signing.SigningError, match="needs a token"):
            signing.world_secret(None, "10.1.2.3", 29999, marker)
        with pytest.raises(signing.SigningError, match="not on this machine"):
            signing.world_secret(None, "127.0.0.1", 29999, {**marker, "host": "elsewhere"})
    finally:
        signing.remove_local_key(path)
    assert not os.path.exists(path)


def test_only_loopback_counts_as_one_machine():
    assert signing.on_loopback("127.0.0.1") and signing.on_loopback("localhost") and signing.on_loopback("::1")
    assert not signing.on_loopback("10.0.0.1")
    assert not signing.on_loopback("no-such-host.invalid")


def test_a_sealed_record_verifies_only_unchanged_under_its_key_and_for_its_purpose():
    key = signing.key_from("secret")
    record = signing.seal(key, "where-ask", {"n": 3, "round": 1, "threads": False})
    assert signing.sealed(key, "where-ask", record)
    assert not signing.sealed(key, "where-answer", record)  # one kind cannot pass for another
    assert not signing.sealed(signing.key_from("other"), "where-ask", record)
    assert not signing.sealed(key, "where-ask", {**record, "threads": True})
    assert not signing.sealed(key, "where-ask", {k: v for k, v in record.items() if k != "sig"})
    assert not signing.sealed(key, "where-ask", "not a record")
