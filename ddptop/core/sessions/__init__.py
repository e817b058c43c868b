"""Sessions: the one protocol every front end consumes (``protocol``) and
its implementations: a job watched by pid (``pid``) here; a launched run and
remote nodes in ``ddptop.core``.  They import only the protocol; the factory
that opens one is ``ddptop.core.factory``."""
