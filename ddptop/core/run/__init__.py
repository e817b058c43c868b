"""How a job is owned: launched (``launcher``), supervised (``supervisor``),
recorded (``journal``), changed by profiles (``profiles``), analysed live
(``pipeline``, shared by every session) and read back (``run_session``, the
session of a run ddptop launched).  May import ``model``, ``analysis`` and
``sources``.
"""
