"""Sessions: the one protocol every front end consumes (``protocol``) and
implementations of it: a job watched by pid (``pid``), a run on another node
over ssh (``ssh``), several nodes as one (``cross_node``); a launched run lives
in ``ddptop.core.run.run_session``.  None imports the factory that opens one
(``ddptop.core.sessions.factory``)."""
