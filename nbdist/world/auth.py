"""An optional shared token that a rank must present to join a world.

The server's marker holds a salted PBKDF2 hash of the token; a joining rank
derives the same hash from its own token and compares. This keeps notebooks
from joining the wrong world by accident, and people who can reach the port
but do not know the token from joining. It is not transport security: the
TCPStore has none, and anyone who can reach the port can read and change
what is stored (see the README).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

from ..errors import TokenError

_ROUNDS = 100_000


def _derive(token: str, salt: bytes) -> str:
    return hashlib.pbkdf2_hmac("sha256", token.encode(), salt, _ROUNDS).hex()


def record(token: str | None) -> dict[str, str] | None:
    """What the server's marker stores for ``token`` (None: no token needed)."""
    if not token:
        return None
    salt = os.urandom(16)
    return {"salt": salt.hex(), "hash": _derive(token, salt)}


def check(marker: dict[str, Any], token: str | None, address: str) -> None:
    """Raise :class:`TokenError` unless ``token`` matches what the server at ``address`` requires."""
    needed = marker.get("auth")
    if needed is None:
        if token:
            raise TokenError(
                f"this notebook has a token, but the server at {address} was started without one: "
                "start rank 0 (or `nbdist serve`) with the same --token, or drop it here"
            )
        return
    if not token:
        raise TokenError(f"the world at {address} needs a token: pass --token or set NBDIST_TOKEN")
    if not hmac.compare_digest(_derive(token, bytes.fromhex(needed["salt"])), needed["hash"]):
        raise TokenError(f"wrong token for the world at {address}")
