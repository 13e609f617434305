"""Where the replicas part ways: comparing what every rank holds, and the operations every rank ran, by hashes.

Owns ``%dist_compare`` (``compare``: names compared across every rank, entry by entry, by hashes; the elements of
the first differing entry fetched alone), ``nbdist.check_replicas`` (``replicas``: a model's and optimizer's
hashes compared inside a training loop, one small collective), and ``%%collective --find-divergence``
(``oplog``: the body run under torch's ``DebugMode`` with output hashes, into one small log a rank;
``firstdiff``: the ranks' logs compared by prefix digests to name the first operation whose output differs).
``hashing`` digests tensors and values alike on every rank.

May import: the shared base, ``nbdist.world`` and ``nbdist.view``. Nothing of cells, backends or drivers: what
runs on every rank runs as a ``%%collective`` body the magic hands the session; a comparison is a collective of
hashes, never a second protocol.
"""
