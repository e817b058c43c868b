"""The background probes: what ddptop looks at beside the ranks' own
streams, each off the caller's thread on one base (``base``: ``Job``, one
run at a time; ``Loop``, from start to stop; the thread's boundary the only
broad catch).

* ``stacks``: every rank's stack on request (``StackCapture``), stack
  samples at a suspected stall (``StackSampler``), and life from stacks for
  a job ddptop did not launch (``StackWatch``);
* ``ras``: NCCL's RAS port asked at a stall, and its pushed events followed
  (``RasProbe``);
* ``telemetry``: GPU and process samples once per interval (``TelemetryLoop``).

The pipeline (``ddptop.core.pipeline``) asks them; the sessions own them.
"""
