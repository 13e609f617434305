"""Signed cells: what a driving notebook sends its followers, and how a follower checks it.

A cell travels through the store as JSON: its source and flags, never
objects. Each is signed with HMAC-SHA256 under a key derived from the world's
secret: the token every rank joined with, or, for a world on one machine
that has none, a random key the rendezvous server keeps in a file only its
user can read (Jupyter's runtime folder, beside the kernels' connection
files). The signed message holds the world round, the sequence number and the
driver's rank and session, so a captured cell cannot be replayed in another
place, another round, or by another notebook. Anyone who can reach the port
can still read and write the store: signing keeps them from running code on
followers, not from reading what the cells say (see the README).

Other records, a ``%dist_where`` request and each rank's answer, are sealed
whole (:func:`seal`) under the same key, with their purpose in the signed
message, so that one kind of record cannot pass for another.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import NbdistError
from .records import MalformedRecord

_T = TypeVar("_T")

_CONTEXT = b"nbdist signed cells v1"
SIGNED = ("round", "seq", "driver", "session", "kind", "source", "flags", "gen", "number")


class SigningError(NbdistError, PermissionError):
    """A cell could not be signed, or a follower refused one that did not verify."""


def key_from(secret: str) -> bytes:
    """The HMAC key for a world's secret (never the secret itself, which may be short)."""
    return hashlib.pbkdf2_hmac("sha256", secret.encode(), _CONTEXT, 1000)


def _message(fields: dict[str, Any]) -> bytes:
    return json.dumps({k: fields.get(k) for k in SIGNED}, sort_keys=True, separators=(",", ":")).encode()


def sign(key: bytes, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with their signature added (``sig``)."""
    return {**fields, "sig": hmac.new(key, _message(fields), hashlib.sha256).hexdigest()}


def verify(key: bytes, cell: dict[str, Any], *, round_: int, seq: int, driver: dict[str, Any]) -> str | None:
    """Why a follower must refuse ``cell`` (None: it may run it).

    ``driver`` is the registration of the rank that holds the world's drive; the
    cell must be signed by the world's key, for this round and this sequence
    number, by that rank's session.
    """
    sig = cell.get("sig")
    if not isinstance(sig, str) or not hmac.compare_digest(
            hmac.new(key, _message(cell), hashlib.sha256).hexdigest(), sig):
        return "its signature does not verify (it was not sent by a notebook of this world)"
    if cell.get("round") != round_:
        return f"it was signed for world round {cell.get('round')}, and this world is round {round_} (a replay)"
    if cell.get("seq") != seq:
        return f"it carries sequence number {cell.get('seq')} where {seq} was due (a replay)"
    if cell.get("driver") != driver.get("rank"):
        return f"it names rank {cell.get('driver')} as its driver, and rank {driver.get('rank')} drives this world"
    if cell.get("session") != driver.get("session"):
        return f"it was sent by another kernel of rank {driver.get('rank')} than the one that drives (a replay)"
    return None


# --- other signed records (a %dist_where request and its answers) ---------------------------

_SEALED = b"nbdist sealed records v1\0"


def _sealed_message(purpose: str, record: dict[str, Any]) -> bytes:
    body = json.dumps({k: v for k, v in record.items() if k != "sig"}, sort_keys=True, separators=(",", ":"))
    return _SEALED + purpose.encode() + b"\0" + body.encode()


def seal(key: bytes, purpose: str, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (JSON values) with a signature over all of it, for ``purpose`` only (``sig`` added)."""
    return {**record, "sig": hmac.new(key, _sealed_message(purpose, record), hashlib.sha256).hexdigest()}


def sealed(key: bytes, purpose: str, record: Any) -> bool:
    """Whether ``record`` (as read back from the store) was sealed with ``key`` for ``purpose``, unchanged."""
    if not isinstance(record, dict) or not isinstance(record.get("sig"), str):
        return False
    return hmac.compare_digest(hmac.new(key, _sealed_message(purpose, record), hashlib.sha256).hexdigest(),
                               record["sig"])


def opened(parse: Callable[[dict[str, Any]], _T], record: Any, key: bytes, purpose: str, n: int,
           round_: int) -> _T | None:
    """What ``parse`` reads from ``record`` if it is sealed with ``key`` for ``purpose`` as number ``n`` of world
    round ``round_``; None when it is not a JSON object, not sealed so, or not the record ``parse`` reads (it
    raised :class:`.records.MalformedRecord`)."""
    if not sealed(key, purpose, record) or record.get("n") != n or record.get("round") != round_:
        return None
    try:
        return parse(record)
    except MalformedRecord:
        return None


# --- the secret of a world without a token, on one machine -----------------------------------

def on_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (a world on one machine), not merely one of this host's."""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except socket.gaierror:
        return False
    return bool(addrs) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addrs)


def _runtime_dir() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return jupyter_runtime_dir()


def local_key_path(port: int, pid: int) -> str:
    return os.path.join(_runtime_dir(), f"nbdist-{port}-{pid}.key")


def create_local_key(port: int) -> str:
    """Write a random key for the server this process starts on ``port``; readable by this user only."""
    path = local_key_path(port, os.getpid())
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def remove_local_key(path: str | None) -> None:
    if path:
        try:
            os.remove(path)
        except FileNotFoundError:
            return


def world_secret(token: str | None, master_addr: str, port: int, marker: dict[str, Any]) -> str:
    """The secret cells of this world are signed with; raise :class:`SigningError` if there is none here."""
    if token:
        return token
    where = f"{master_addr}:{port}"
    if not on_loopback(master_addr):
        raise SigningError(f"following or driving the world at {where} needs a token: re-run %%dist_init with "
                           "the same --token (or NBDIST_TOKEN) in every notebook")
    path = local_key_path(port, int(marker.get("pid", 0)))
    if marker.get("host") != socket.gethostname() or not os.path.exists(path):
        raise SigningError(f"the world at {where} has no token, and its server's key is not on this machine "
                           "(a tunnel to another host?): re-run %%dist_init with the same --token in every notebook")
    with open(path) as f:
        return f.read().strip()
