"""Where data comes from: files, processes, GPUs, stacks, NCCL RAS, the Flight Recorder.

The parts of one source share a prefix: ``log_*`` (tail a growing file, wake on
a change), ``proc_*`` (the process tree, torchrun from outside), ``gpu_*`` (the
GPU backend protocol, NVML, the simulator, CUDA_VISIBLE_DEVICES),
``telemetry*`` (per-tick samples and their probe), ``stack_*`` (py-spy, the
stack probe, saved dumps), ``ras_*`` (NCCL RAS's port, its reports and the
probe), ``flight_recorder``.  ``probe_base`` is the one base of the background
probes.  May import ``model`` and ``analysis``.
"""
