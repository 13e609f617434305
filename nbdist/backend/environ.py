"""What nbdist puts in ``os.environ``, kept so that leaving puts back what was there."""

from __future__ import annotations

import builtins
import os


class Environ:
    """The variables nbdist set in this process, what they held before, and which were set at ``%load_ext``."""

    def __init__(self) -> None:
        self.applied: dict[str, str] = {}  # what nbdist itself put in os.environ
        self.replaced: dict[str, str | None] = {}  # what those variables held before nbdist set them
        self.early: set[str] = set()  # variables set at %load_ext; kept until the extension is unloaded

    def set(self, values: dict[str, str]) -> None:
        """Set environment variables, remembering what they held, so that leaving puts them back."""
        for key, value in values.items():
            if key not in self.replaced:
                self.replaced[key] = os.environ.get(key)
            os.environ[key] = value
            self.applied[key] = value

    def restore(self, keep: builtins.set[str] | None = None) -> None:  # set: the method above
        """Put back what nbdist changed in os.environ, where the value is still nbdist's (but ``keep``)."""
        keep = keep or set()
        for key, old in list(self.replaced.items()):
            if key in keep:
                continue
            if os.environ.get(key) == self.applied.get(key):  # else changed since by someone else: theirs
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
            del self.replaced[key]
            self.applied.pop(key, None)

    def as_user_set(self) -> dict[str, str]:
        """The environment as the user set it: values nbdist itself set are left out."""
        return {k: v for k, v in os.environ.items() if self.applied.get(k) != v}
