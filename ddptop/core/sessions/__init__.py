"""Sessions: the one protocol every front end consumes (``protocol``) and
implementations of it: a run on another node over ssh (``ssh``), several
nodes as one (``cross_node``); the others (a launched run, a job watched by
pid) live in ``ddptop.core``.  None imports the factory that opens one
(``ddptop.core.factory``)."""
