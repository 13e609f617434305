"""What nbdist put in ``os.environ``, and what it replaced, so that leaving puts the user's values back."""

from __future__ import annotations

import os


class Applied:
    """The variables nbdist set in this process, with the values they held before."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}  # what nbdist itself put in os.environ
        self.replaced: dict[str, str | None] = {}  # what those variables held before nbdist set them

    def set(self, values: dict[str, str]) -> None:
        """Set environment variables, remembering what they held, so that :meth:`restore` puts them back."""
        for key, value in values.items():
            if key not in self.replaced:
                self.replaced[key] = os.environ.get(key)
            os.environ[key] = value
            self.values[key] = value

    def restore(self, keep: set[str] | None = None) -> None:
        """Put back what nbdist changed in os.environ, where the value is still nbdist's (but ``keep``)."""
        keep = keep or set()
        for key, old in list(self.replaced.items()):
            if key in keep:
                continue
            if os.environ.get(key) == self.values.get(key):  # else changed since by someone else: theirs
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
            del self.replaced[key]
            self.values.pop(key, None)

    def users(self) -> dict[str, str]:
        """The environment as the user set it: values nbdist itself set are left out."""
        return {k: v for k, v in os.environ.items() if self.values.get(k) != v}
