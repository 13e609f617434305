"""nbdist's version, in the shared base: every part may read it."""

__version__ = "0.1.0"
