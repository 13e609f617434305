"""The world: joining, the rendezvous store, liveness and signing.

Owns the rendezvous server and its clients (``store``, ``auth``), every key kept in the store (``keys``) and the
records kept under them, typed and validated where read (``records``; a rank's record of a ``%%collective`` at
its end, ``capture_record``; how a spawned worker's kernel ended, ``exited_record``), rounds and joining
(``rendezvous``, ``reach``), a formed world: its members
(``world``), its round, step and generation numbers (``counters``), each rank's notes (``notes``) and every
wait's checks (``checks``), its meetings (``gather``, the executor; ``meeting``, what a rank at one does next;
``verdict``, what one decided), heartbeats and who is alive by them (``heartbeat``, ``pulse``, ``liveness``),
signed messages (``signing``), this host's network facts (``netinfo``) and one kernel's link to the store: its
server, connections, heartbeat and world (``link``).

May import: ``nbdist.errors``, ``nbdist.config``, ``nbdist.ranksets``. It knows nothing of cells,
backends, views or drivers.
"""
