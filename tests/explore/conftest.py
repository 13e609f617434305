"""One real rendezvous server for every explorer test of the session (each run uses a fresh world round)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import free_port

from .explorer import Lab


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    with Lab(free_port(), ranks=3) as shared:
        yield shared
