"""From notebook to job: a rank notebook as a script that torchrun or srun runs.

Owns turning a notebook into a script (``convert``), what an exported script
calls to form its world from the launcher, with the environment plan a
notebook's ``%%dist_init`` uses, and to print as a notebook shows (``runtime``),
a ``parameters`` cell as command-line flags (``params``) and ``nbdist export
--run N``, the script under torchrun with each rank's lines marked (``launch``).

May import: the shared base, ``nbdist.world``, ``nbdist.backend``,
``nbdist.view`` and ``nbdist.drive``.
"""
