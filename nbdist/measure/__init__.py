"""Measuring and watching: the bandwidth bench and the dashboard.

Owns ``%dist_bench`` (``bench``), its factors, table and plot
(``benchreport``), ``nbdist bench`` (``benchcli``) and ``%dist_dashboard``
(``dashboard``).

May import: every part but the top (``magics``, ``session``, ``cli``).
"""
