"""The network rows: InfiniBand devices and their port states (sysfs), the
interface variables NCCL and gloo read (``NCCL_SOCKET_IFNAME``,
``GLOO_SOCKET_IFNAME``, ``NCCL_IB_HCA``) against the interfaces and HCAs this
machine has, with NCCL's own list syntax (:func:`nccl_list_match`), and whether
the master port can be bound (and by whom it is held when it cannot).
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Callable, Iterable

from ddptop.core.tools.doctor.report import FAIL, OK, SKIPPED, WARN, Row


def infiniband_devices(root: Path = Path("/")) -> dict[str, list[str]]:
    """IB device -> its ports' states ("4: ACTIVE")."""
    base = root / "sys/class/infiniband"
    out = {}
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        states = []
        for port in sorted((d / "ports").glob("*")):
            try:
                states.append(f"port {port.name}: {(port / 'state').read_text().strip()}")
            except OSError:
                pass
        out[d.name] = states
    return out


def check_infiniband(ib: dict[str, list[str]]) -> Row:
    if not ib:
        return Row("InfiniBand", OK, "no InfiniBand devices (/sys/class/infiniband): multi-node traffic uses TCP sockets",
                   [], "", {"devices": {}})
    ev = [f"{d}: {', '.join(s) or 'no ports'}" for d, s in ib.items()]
    active = [d for d, s in ib.items() if any("ACTIVE" in x for x in s)]
    if not active:
        return Row("InfiniBand", WARN, f"{len(ib)} device(s), no port ACTIVE", ev,
                   "check cabling and the subnet manager (ibstat); NCCL falls back to sockets or fails", {"devices": ib})
    return Row("InfiniBand", OK, f"{len(ib)} device(s), {len(active)} with an active port", ev, "", {"devices": ib})


def nccl_list_match(spec: str, names: Iterable[str]) -> list[str]:
    """The names an NCCL interface list selects (NCCL_SOCKET_IFNAME, NCCL_IB_HCA):
    comma-separated prefixes; a leading ``^`` excludes instead; a leading ``=``
    (after ``^``) makes the items exact names.  ``:port`` suffixes (IB) are ignored."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    items = [i.split(":")[0].strip() for i in spec.split(",") if i.split(":")[0].strip()]

    def hit(n):
        return any(n == i if exact else n.startswith(i) for i in items)
    return [n for n in names if hit(n) != exclude]


def check_nccl_net(env: dict[str, str], ifaces: list[str] | str, ib: dict[str, list[str]]) -> Row:
    """``ifaces``: the machine's interface names, or why they could not be listed."""
    if isinstance(ifaces, str):
        set_ = [k for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if k in env]
        return Row("NCCL network", SKIPPED if not set_ else WARN,
                   f"could not list this machine's network interfaces ({ifaces})"
                   + (f": {' and '.join(set_)} not checked" if set_ else ""), [], "", {"error": ifaces})
    ev = [f"interfaces: {', '.join(ifaces) or 'none'}"]
    bad, warns = [], []
    data = {"interfaces": ifaces}
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec is not None:
        m = nccl_list_match(spec, ifaces)
        ev.append(f"NCCL_SOCKET_IFNAME={spec} selects: {', '.join(m) or 'nothing'}")
        data["nccl_socket_ifname"] = m
        if not m:
            bad.append(f"NCCL_SOCKET_IFNAME={spec} matches no interface here (NCCL: `no socket interface found`)")
        elif spec.lstrip("^=") and all(n == "lo" for n in m):
            warns.append("NCCL_SOCKET_IFNAME selects only loopback: fine on one node, multi-node jobs cannot connect")
    gspec = env.get("GLOO_SOCKET_IFNAME")
    if gspec is not None:
        missing = [n for n in gspec.split(",") if n.strip() and n.strip() not in ifaces]
        ev.append(f"GLOO_SOCKET_IFNAME={gspec}" + (f" (missing: {', '.join(missing)})" if missing else ""))
        if missing:
            bad.append(f"GLOO_SOCKET_IFNAME names interface(s) that do not exist: {', '.join(missing)} (gloo wants exact names)")
    hca = env.get("NCCL_IB_HCA")
    if hca is not None:
        m = nccl_list_match(hca, list(ib))
        ev.append(f"NCCL_IB_HCA={hca} selects: {', '.join(m) or 'nothing'} (IB devices: {', '.join(ib) or 'none'})")
        if not ib:
            warns.append("NCCL_IB_HCA is set but this machine has no InfiniBand devices")
        elif not m:
            bad.append(f"NCCL_IB_HCA={hca} matches none of the IB devices ({', '.join(ib)})")
    if spec is None and gspec is None and hca is None:
        return Row("NCCL network", OK, "NCCL_SOCKET_IFNAME / NCCL_IB_HCA not set: NCCL picks interfaces itself", ev, "", data)
    if bad:
        return Row("NCCL network", FAIL, bad[0], ev + bad[1:] + warns,
                   "fix the variable to name interfaces that exist on every node (see `ip -br addr`)", data)
    if warns:
        return Row("NCCL network", WARN, warns[0], ev + warns[1:], "check the variable against the interfaces of every node", data)
    return Row("NCCL network", OK, "interface variables match this machine's interfaces", ev, "", data)


def port_owner(port: int) -> str | None:
    import psutil

    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
                if c.pid:
                    try:
                        return f"pid {c.pid} ({' '.join(psutil.Process(c.pid).cmdline()[:4])})"
                    except psutil.Error:
                        return f"pid {c.pid}"
                return "another process"
    except (OSError, psutil.Error):  # AccessDenied on some systems
        return None
    return None


def try_bind(host: str, port: int) -> str | None:
    """None when ``host:port`` can be bound (as torch's TCPStore would, with SO_REUSEADDR), else the error."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno)) + f" ({e.strerror})"
    return None


def check_master_port(port: int, bind: Callable[[str, int], str | None] = try_bind,
                      owner: Callable[[int], str | None] = port_owner) -> Row:
    res = {h: bind(h, port) for h in ("127.0.0.1", "0.0.0.0")}
    ev = [f"bind {h}:{port}: {'free' if e is None else e}" for h, e in res.items()]
    if all(e is None for e in res.values()):
        return Row("Master port", OK, f"{port} is free", ev, "", {"port": port, "free": True})
    who = owner(port)
    if who:
        ev.append(f"listening: {who}")
    return Row("Master port", WARN, f"{port} is in use" + (f" by {who}" if who else ""), ev,
               f"a job using --master-port {port} on this node as its master will fail with `address already in use`; "
               "pick another port (torchrun --master-port P, or --rdzv-endpoint HOST:P)", {"port": port, "free": False})
