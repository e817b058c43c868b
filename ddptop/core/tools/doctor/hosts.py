"""``ddptop doctor --host HOST``: the checks run on other nodes, by their own ddptop over ssh.

``doctor_on_hosts`` runs ``ddptop doctor --json`` on each node
(``doctor_rows``), over the same ssh as ``ddptop attach`` (``core.sessions.ssh``),
and shows the rows per host.
"""

from __future__ import annotations

import json
import shlex
import subprocess

from ddptop.core.model.settings import settings
from ddptop.core.sessions.transports import SSH_OPTIONS, check_host, remote_command
from ddptop.core.sessions.wire import install_hint
from ddptop.core.tools.doctor.report import FAIL, Row, exit_code, format_rows, summary


def doctor_rows(host: str, ssh: list[str], remote_cmd: str, args: list[str], timeout: float = 120) -> list[Row]:
    """The doctor's rows on HOST, run there by its own ddptop over ssh; a host
    that cannot be reached, or has no ddptop, is one failed row saying so."""

    try:
        check_host(host)
    except ValueError as e:
        return [Row("ssh", FAIL, str(e), [], "fix the host name (in --host, or the hosts file)")]
    argv = [*ssh, *SSH_OPTIONS, "--", host, remote_command([*shlex.split(remote_cmd), "doctor", "--json", *args])]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [Row("ssh", FAIL, f"{host}: no answer in {timeout:g} s", [" ".join(argv)])]
    except OSError as e:
        return [Row("ssh", FAIL, f"could not run ssh: {e}", [" ".join(argv)])]
    try:
        d = json.loads(r.stdout)
        return [Row(**{k: v for k, v in row.items() if k in Row.__dataclass_fields__}) for row in d["rows"]]
    except (ValueError, KeyError, TypeError):
        err = (r.stderr or r.stdout).strip().splitlines()
        last = err[-1] if err else f"exit {r.returncode}"
        if r.returncode == 127 or "command not found" in r.stderr or "No module named ddptop" in r.stderr:
            return [Row("ddptop", FAIL, f"ddptop is not installed on {host}", [last],
                        f"install it there: {install_hint()} (or point --remote-ddptop at it)")]
        return [Row("ssh", FAIL, f"{host}: {last}", [" ".join(argv)],
                    "check that `ssh HOST` works without a password prompt (keys or agent)")]


def doctor_on_hosts(hosts: list[str], *, ssh: str | None, remote_ddptop: str | None, workers: int | None,
                    master_port: int, as_json: bool) -> int:
    """``ddptop doctor --host H...``: each host's rows, printed per host (a
    table each, or one JSON document); the exit code is the worst host's.
    ``ssh`` and ``remote_ddptop`` default to $DDPTOP_SSH and $DDPTOP_REMOTE."""

    ssh_argv = shlex.split(ssh) if ssh else list(settings().ssh)
    remote_cmd = remote_ddptop or settings().remote
    args = (["--workers", str(workers)] if workers is not None else []) + ["--master-port", str(master_port)]
    per_host = {h: doctor_rows(h, ssh_argv, remote_cmd, args) for h in hosts}
    if as_json:
        print(json.dumps({"hosts": {h: {"rows": [r.to_dict() for r in rows], "summary": summary(rows)}
                                    for h, rows in per_host.items()}}, indent=2))
    else:
        print("\n\n".join(f"== {h} ==\n{format_rows(rows)}" for h, rows in per_host.items()))
    return max(exit_code(rows) for rows in per_host.values())
