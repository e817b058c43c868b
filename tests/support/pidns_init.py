"""pid 1 of a PID namespace of its own, for one pytest-xdist worker (see conftest.py).

    unshare --pid --fork --mount-proc --kill-child PYTHON pidns_init.py PYTHON ARGS...

runs ``PYTHON ARGS...`` (the worker) as its only child and reaps every process
orphaned in the namespace (a detached supervisor, a rank torchrun left behind),
as an init does, so none lingers as a zombie.  When the worker exits, this
exits with its status, and the kernel kills whatever the worker's tests left
running.  Inside, ``/proc`` shows the worker and its descendants only: a test
that looks for torchrun processes finds its own job, never another worker's.
"""

import os
import signal
import sys


def main() -> int:
    worker = os.fork()
    if worker == 0:
        os.execv(sys.argv[1], sys.argv[1:])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda n, _frame: os.kill(worker, n))
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if pid == worker:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
