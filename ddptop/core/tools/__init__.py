"""The tools: ``ddptop diagnose`` (and ``run_story``, a run's own story),
``ddptop fix``, ``ddptop bench p2p`` (``p2p_bench``) and ``ddptop doctor``.
May import every core room below it.
"""
