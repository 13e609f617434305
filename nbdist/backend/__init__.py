"""The backends: gloo, NCCL and HCCL, their environment plans and process groups.

Owns the choice of backend and device before torch is imported (``backends``,
``ascend``), environment plans (``envplan``, ``hcclports``, ``tunnel``,
``cpplog``, ``debugmode``), what nbdist set in ``os.environ`` (``environ``),
torch's thread count on a rank (``threads``), building, judging and cutting
process groups (``procgroup``), the notebook's own ``init_process_group`` in a
formed world (``userinit``), ``nbdist doctor``'s checks (``doctor``), and a kernel's
backend state (``state``), set up as it joins a world (``setup``).

May import: the shared base (``errors``, ``config``, ``ranksets``) and ``nbdist.world``
(the store, network facts). Nothing of cells, views or drivers.
"""
