"""How ddptop decides that a job hangs, and who is to blame: pure code, no I/O.

Read in this order:

* ``analyzer.py``   events in, alarms out: feeds the parsers (progress,
                    failure signatures) and the detector, live and in
                    ``ddptop diagnose``.
* ``detector.py``   the hang decision, the one place: per-rank progress and
                    telemetry on an injected clock, the threshold learned
                    from the job's own rhythm, and ``decide(now)``, which
                    returns what to do (take stack samples, raise this
                    stall).  It owns its sampling state; the pipeline only
                    carries the decision out.
* ``stack_verdict.py``  py-spy dumps -> typed evidence: who is frozen, moving,
                    waiting in a collective, in backward or on the GPU (a
                    CUDA synchronisation point: native CUDA/NCCL frames, or
                    one line spinning while the GPU is busy), who is the odd
                    one out.
* ``stack_judge.py``  who hangs and who is the odd one out, from every
                    rank's ``Where`` (one node, or every node: ``combine``);
                    the typed evidence itself is ``ddptop.core.model.evidence``.
* ``culprits.py``   the one function per question that names culprits: of a
                    stall (live) and of a failure (live alarms and
                    ``diagnose`` alike).
* ``ras_verdict.py`` what NCCL's RAS report says about who is behind.
* ``wording.py``    the one sentence builder: says only what the evidence
                    shows, in the phase the job is in.
* ``nodes.py``      one hang, one alarm across nodes: the merged view's
                    cross-node alarm takes the nodes' own stall alarms in.
"""
