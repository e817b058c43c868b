"""NCCL RAS: NCCL's own view of a job, asked over its local TCP port.

Since NCCL 2.24 every NCCL process runs a RAS thread listening on
``NCCL_RAS_ADDR`` (default ``localhost:28028``; off with
``NCCL_RAS_ENABLE=0``).  Any one process answers for the whole job: per
communicator, each rank's host, pid and GPU, how many collectives of each
kind it has launched, and which ranks are missing, unresponsive or dead.

* ``client``: asking (``query``), following pushed events (``monitor``),
  the address (``parse_addr``, ``free_port``); plain sockets, no torch, no
  NCCL;
* ``parse``: reading both report formats (``parse``, ``parse_json``,
  ``parse_text``) and the pushed events (``parse_monitor_line``);
* ``types``: what an answer holds (``RasStatus``, ``RasComm``, ``RasRank``,
  ``PeerEvent``) and the errors of asking.

Who is behind (the ranks that launched fewer operations of a kind than the
rest, or that are missing or dead, as global ranks) is the analysis
package's ``ddptop.core.analysis.ras.verdict``.  The public API is
re-exported here: ``from ddptop.core import ras; ras.query(addr)``.
"""

from ddptop.core.ras.client import DEFAULT_ADDR, PROTOCOL, free_port, monitor, parse_addr, query
from ddptop.core.ras.parse import parse, parse_json, parse_monitor_line, parse_text
from ddptop.core.ras.types import (KINDS, MonitorUnsupported, PeerEvent, RasComm, RasError, RasRank, RasStatus,
                                   job_pids)

__all__ = ["DEFAULT_ADDR", "KINDS", "PROTOCOL", "MonitorUnsupported", "PeerEvent", "RasComm", "RasError", "RasRank",
           "RasStatus", "free_port", "job_pids", "monitor", "parse", "parse_addr", "parse_json", "parse_monitor_line",
           "parse_text", "query"]
