"""Sessions: the one protocol every front end consumes (``protocol``).  The
implementations (a launched run, a job watched by pid, remote nodes) live
beside it in ``ddptop.core`` and import only the protocol; the factory that
opens one is ``ddptop.core.factory``."""
