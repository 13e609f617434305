"""The view: pure rendering of plain data (dicts, lists, strings).

Owns the facts and status tables (``display``) and their words (``notes``), a cell's side-by-side table
(``celltable``, ``align``) and its grouped form for many ranks (``grouped``, ``numbers``; a group is named
by the base's ``nbdist.ranksets``), sanitising a rank's HTML (``sanitize``), fitting a record to the store
(``shrink``), tracebacks (``tracebacks``), when several ranks' errors are one (``alike``), pictures of tensors
(``pictures``) and a traced cell's calls and timeline (``trace``, ``timeline``).

May import: the shared base only. It never imports the cell protocol or the
world: what it draws arrives as plain data, or as a record it reads by the fields a
Protocol of its own names (a cell's captures: ``celltable.Captured``).
"""
