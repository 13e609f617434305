"""Driving: one notebook runs the cells of other ranks.

Owns driving and following (``follow``), what ``--spawn N`` means (``spawn``),
local worker kernels (``workers``), local kernels through jupyter_client
(``kernels``) and ``nbdist run`` (``runner``).

May import: the shared base, ``nbdist.world``, ``nbdist.backend``,
``nbdist.view`` and ``nbdist.cell``.
"""
