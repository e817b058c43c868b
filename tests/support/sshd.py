"""A real OpenSSH server on 127.0.0.1 for the attach tests.

Generated host and client keys (no passwords), an unprivileged port, owned by
the test: started here, stopped by pid afterwards.  Two host aliases, node-a
and node-b, both reach it (two "nodes" on one machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
HOSTS = ("node-a", "node-b")


@dataclass
class Sshd:
    proc: subprocess.Popen
    port: int
    config: Path  # client config: `ssh -F config node-a`
    log: Path

    @property
    def ssh(self) -> list[str]:
        return ["ssh", "-F", str(self.config)]

    def sessions(self) -> list[psutil.Process]:
        """The per-connection sshd processes (children of the listener)."""
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []

    def drop_links(self) -> int:
        """Cut every open connection, as a network drop would (server side)."""
        n = 0
        for p in self.sessions():
            try:
                p.kill()
                n += 1
            except psutil.Error:
                pass
        return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)


def start_sshd(d: Path) -> Sshd:
    if not os.path.exists(SSHD) or not shutil.which("ssh"):
        if os.environ.get("CI"):
            pytest.fail("sshd/ssh missing: .ci/run installs openssh-server")
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    _keygen(d / "host_key")
    _keygen(d / "client_key")
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    port = _free_port()
    (d / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {d / 'host_key'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxStartups 100
MaxSessions 100
""")
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    user = psutil.Process().username()
    cfg = "".join(f"""\
Host {h}
  HostName 127.0.0.1
  HostKeyAlias [127.0.0.1]:{port}
  Port {port}
  User {user}
  IdentityFile {d / 'client_key'}
  IdentitiesOnly yes
  UserKnownHostsFile {d / 'known_hosts'}
  StrictHostKeyChecking yes
  LogLevel ERROR
  ConnectTimeout 10
""" for h in HOSTS)
    (d / "ssh_config").write_text(cfg)
    log = d / "sshd.log"
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError("sshd did not start listening in 20 s")
    s = Sshd(proc, port, d / "ssh_config", log)
    r = subprocess.run([*s.ssh, "node-a", "true"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        stop_sshd(s)
        raise RuntimeError(f"ssh to the test sshd failed: {r.stderr} / {log.read_text()}")
    return s


def stop_sshd(s: Sshd) -> None:
    for p in s.sessions():
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(s.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        s.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(s.proc.pid, signal.SIGKILL)
        s.proc.wait(timeout=10)


def remote_ddptop(runs_dir: Path) -> str:
    """How the remote side runs ddptop: this interpreter, this checkout, these runs,
    and the GPUs as this side sees them (sshd gives the remote side a fresh
    environment: the NVIDIA library's path and CUDA_VISIBLE_DEVICES are passed on)."""
    import shlex

    root = Path(__file__).resolve().parents[2]  # the checkout (this file is tests/support/sshd.py)
    gpu_env = "".join(f"{k}={shlex.quote(os.environ[k])} " for k in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
                      if k in os.environ)
    return (f"env DDPTOP_RUNS_DIR={runs_dir} PYTHONPATH={root} PATH={os.path.dirname(sys.executable)}:/usr/bin:/bin "
            f"{gpu_env}{sys.executable} -m ddptop")
