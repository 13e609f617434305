"""Healing a world once a rank's kernel was started again: bringing that rank's state back, without restarting
the others.

Owns ``%dist_sync`` (``sync``: names copied from a survivor to the ranks that lack them, tensors through
torch.distributed) and ``%dist_replay`` (``replay``: the earlier cells of the world that called no collective,
run again on the restarted rank alone, as ``history`` chooses them from the driving notebook's record of its
cells).

May import: the shared base, ``nbdist.world`` (the store's records of earlier steps) and ``nbdist.view``. Nothing
of cells, backends or drivers: what runs on every rank runs as a ``%%collective`` body the magic hands the session.
"""
