"""A deterministic interleaving explorer for the lockstep protocol (issue 34, item 4).

Two or three simulated ranks, each a thread running nbdist's own turn code (a real ``nbdist.session.Session``:
``nbdist.cell.turn``, ``nbdist.cell.cells``, ``nbdist.world.world``) on its own connection to one real
``TCPStore`` on loopback. Every store operation of a rank waits at a gate until the scheduler lets it run; the
scheduler chooses only when every rank is at a gate, blocked in a wait, or finished, so a run is decided by its
choices alone and replays from them. Waits block in virtual time, which moves only when no rank can run.

- :mod:`.clock`: virtual time, and the ``time`` module nbdist's modules see during a run;
- :mod:`.gate`: the store client whose every operation passes a gate;
- :mod:`.scheduler`: one run: gates, waits, ticks, heartbeats, events (the stop button, a killed kernel);
- :mod:`.explorer`: the store, the choosers, exhaustive search (2 ranks), seeded random runs, replay;
- :mod:`.invariants`: checks a scenario runs on a finished run;
- :mod:`.kernel`: one rank's kernel: a real session's ``%%collective`` and ``%dist_barrier``, without IPython,
  a body or a process group;
- :mod:`.scenarios`: the scenarios: what every rank runs, the events on offer, the checks;
- ``python -m tests.explore``: long runs (see ``--help``).
"""
