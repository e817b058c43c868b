"""The bottom room: what every other room shares, and imports nothing of ddptop.

* ``events``: the one event stream (frozen, JSON-serialisable dataclasses);
* ``evidence``: the typed evidence events carry (where each rank is, stack
  groups, the one rule for "this rank is working");
* ``gpu_facts``, ``ras_types``: NVML's and NCCL RAS's values as ddptop holds them;
* ``run_meta``: what a launch was (a run's ``meta.json``);
* ``session_protocol``: the one protocol every session implements and every
  front end consumes; ``command_result``: the answer to a command;
* ``settings``: the one reader of the ``DDPTOP_*`` environment;
* ``version_numbers``: the one version parser.
"""
