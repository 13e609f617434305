"""The cell: the protocol one ``%%collective`` (or a plain cell's collective) runs on one rank.

Owns one rank's turn at a step, its phases and how a step ends early
(``turn``), the one driver every kind of step runs through (``step``), a ``%%collective``'s part in it
(``cells``) and the error it ends with (``cellerror``; ``names``: what a kernel that took over a slot
lacks, said with its NameError), what the last rank at a cell's end
finds for every rank and whose records each rank reads there (``ending``), running and capturing the body
(``capture``, ``outputlog``, ``progress``; ``wholeoutput``: a rank's whole output kept on its disk once its
table leaves some out, ``wholeask``: fetched through the store by a notebook on another host), checking collectives
(``fingerprint``, ``history``, ``hooks``), a rank's stop state in one object (``stops``), watching and
stopping a body (``watch``, run by one thread per kernel: ``watchthread``; ``stopper``, ``guard``, ``prestart``:
the stop state's inputs), whether a cell
started a collective by torch's own count (``inflight``), the plain-cell safety net (``plain``),
building and rebuilding the process group with every rank (``rebuild``), the
live table (``live``), what a finished cell shows (``outcome_view``) and one kernel's side of its cells
(``kernelturn``: IPython's cell events, the running cell's turn, the stop button and the watchers).

May import: the shared base, ``nbdist.world``, ``nbdist.backend`` and
``nbdist.view``. Nothing of drivers or measuring.
"""
