"""Driving: one notebook runs the cells of other ranks.

Owns driving and following (``follow``), what one kernel drives or follows (``driving``), the follower with no kernel
(``headless``, ``nbdist follow``), the launchers' rank variables
(``launchers``), what ``--spawn N`` means (``spawn``), local worker kernels
(``workers``), when a dead one is started again (``restarts``), the watch that starts it again
(``supervisor``), followers as one Slurm job (``slurm``) and what its srun says (``srunlog``), local
kernels through jupyter_client (``kernels``) and ``nbdist run`` (``runner``).

May import: the shared base, ``nbdist.world``, ``nbdist.backend``,
``nbdist.view`` and ``nbdist.cell``.
"""
