"""Measuring and watching: the bandwidth bench and the dashboard.

Owns ``%dist_bench`` (``bench``), its factors, table and plot
(``benchreport``), ``nbdist bench`` (``benchcli``), ``%dist_dashboard``
(``dashboard``), and plain torch's own answer to compare with (``plain_torch``).

May import: every part but the top (``magics``, ``session``, ``cli``).
"""
