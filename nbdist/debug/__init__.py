"""Debugging a world: where every rank is, answered while the ranks are busy; post-mortem on any rank.

Owns ``%dist_where`` and ``nbdist where``: the protocol through the store, a
signed request and each rank's signed answer from its heartbeat thread
(``where``), every rank's stacks merged into one tree labelled with rank sets
(``stacks``), torch's Flight Recorder gathered and matched per group
(``recorder``), native frames through py-spy (``native``) and the report
(``report``). Owns ``%dist_pdb`` too: each rank's last failed cell kept, and
IPython's debugger on it, here or on another rank from its heartbeat
(``postmortem``), its input and output relayed through the store, signed
(``relay``). Owns breakpoints on any rank (``breakpoints``), where every rank was
when a cell hung (``hangs``), and what a cell takes of both (``aids``).

May import: the shared base, ``nbdist.world`` (the store, signing) and
``nbdist.view`` (rank sets, what a cell's frame is). Nothing of cells,
backends or drivers.
"""
