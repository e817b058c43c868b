"""NCCL profiles: named changes to a launch.

A profile sets or unsets environment variables, overrides torchrun options
(``--nproc-per-node 1``), rewrites script arguments (``--num_workers`` halved),
and may ask the injected hook to override ``init_process_group``'s backend or
timeout (so ``gloo`` and ``fail-fast`` work on scripts that hard-code
``init_process_group("nccl")``).

Built-in profiles can be added to or overridden in TOML, in
``~/.config/ddptop/profiles.toml`` and then ``./ddptop.toml``::

    [profiles.my-fix]
    description = "P2P off and more debug"
    for = "our 8-GPU box hangs at start"
    env = { NCCL_P2P_DISABLE = "1", NCCL_DEBUG = "INFO" }
    unset = ["NCCL_SOCKET_IFNAME"]
    torchrun_args = { "--nproc-per-node" = "4" }
    script_args = { "--num_workers" = "2" }      # or "half"
    backend = "gloo"                              # init_process_group override
    pg_timeout = 60                               # seconds
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import tomllib

from ddptop.core.sources.proc_torchrun import TorchrunOptions

MASK = "***"
# a name is secret when one of its segments (split at _ - . and case changes) is, or ends with, one of
# these (HF_TOKEN, hfToken, API_KEY, APIKEY, DB_PASSWD, AWS_SECRET_ACCESS_KEY, GOOGLE_CREDENTIALS,
# AUTH, BASIC_AUTH; not AUTHOR, not KEYBOARD, not PWD, the working directory)
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL",
                 "CREDENTIALS", "CREDS", "AUTH", "COOKIE", "SESSIONID")
# ...unless the name is about a tokenizer's tokens or a count (--pad-token, --eos-token, --max-token-len,
# --num-key-heads): words of training scripts, not credentials
_NOT_SECRET_BEFORE = frozenset(("PAD", "EOS", "BOS", "UNK", "SEP", "CLS", "MASK", "SPECIAL", "MAX", "MIN", "NUM",
                                "START", "END", "SORT", "DICT", "TEXT", "IMAGE", "AUDIO", "LABEL", "INPUT"))
_NOT_SECRET_AFTER = frozenset(("LEN", "LENGTH", "SIZE", "DIM", "COUNT", "LIMIT", "HEADS", "TYPE", "TYPES"))
_SEGMENT = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def is_secret(name: str) -> bool:
    segs = [seg.upper() for part in re.split(r"[^A-Za-z0-9]+", name) for seg in (_SEGMENT.findall(part) or [part])]
    for i, seg in enumerate(segs):
        if seg in _SECRET_WORDS or (len(seg) > 4 and seg.endswith(("TOKEN", "APIKEY", "SECRET", "PASSWORD",
                                                                   "PASSWD"))):
            if seg in ("TOKEN", "KEY") and ((i > 0 and segs[i - 1] in _NOT_SECRET_BEFORE)
                                            or (i + 1 < len(segs) and segs[i + 1] in _NOT_SECRET_AFTER)):
                continue
            return True
    return False


def mask_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def mask_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line with the values of secret-named options masked, in both
    ``--hf-token X`` and ``--api-key=X`` forms (``-p`` style short options are
    left alone: their names say nothing)."""
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next:
            hide_next = False
            if not tok.startswith("-") or tok == "-":
                out.append(MASK)
                continue
        if tok.startswith("--") and len(tok) > 2:
            name, eq, _value = tok[2:].partition("=")
            if is_secret(name):
                if eq:
                    out.append(f"--{name}={MASK}")
                    continue
                hide_next = True
        out.append(tok)
    return out


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    for_: str = ""
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    torchrun_args: dict[str, str] = field(default_factory=dict)
    script_args: dict[str, str] = field(default_factory=dict)
    backend: str | None = None
    pg_timeout: float | None = None
    source: str = "built-in"

    def env_for(self, run_dir: str | Path) -> dict[str, str]:
        """Its variables as a launch into ``run_dir`` sets them (``{run_dir}`` in a value named)."""
        return {k: v.replace("{run_dir}", str(run_dir)) for k, v in self.env.items()}

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "for": self.for_, "env": mask_env(self.env),
                "unset": list(self.unset), "torchrun_args": self.torchrun_args, "script_args": self.script_args,
                "backend": self.backend, "pg_timeout": self.pg_timeout, "source": self.source}


_WORKER_FLAGS = {"--num_workers": "half", "--num-workers": "half", "--workers": "half", "-j": "half"}

BUILTIN: list[Profile] = [
    Profile("default", "nothing changed", "baseline"),
    Profile("p2p-off", "NCCL_P2P_DISABLE=1: no GPU peer-to-peer, collectives go through host memory",
            "hang at 100% GPU at start (P2P broken by ACS/IOMMU, drivers, some H800/4090 boxes)",
            env={"NCCL_P2P_DISABLE": "1"}),
    Profile("shm-off", "NCCL_SHM_DISABLE=1: no shared-memory transport",
            "/dev/shm too small in containers", env={"NCCL_SHM_DISABLE": "1"}),
    Profile("ib-off", "NCCL_IB_DISABLE=1: no InfiniBand", "broken InfiniBand setup", env={"NCCL_IB_DISABLE": "1"}),
    Profile("nccl-debug", "NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,P2P,NET, TORCH_DISTRIBUTED_DEBUG=DETAIL",
            "`unhandled system error` and friends",
            env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P,NET", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    Profile("cuda-sync", "CUDA_LAUNCH_BLOCKING=1: every GPU kernel runs synchronously, so a CUDA error names "
            "the op that caused it (slow)", "illegal memory access, device-side assert",
            env={"CUDA_LAUNCH_BLOCKING": "1"}),
    Profile("eager-load", "CUDA_MODULE_LOADING=EAGER: every kernel loaded when CUDA starts, so a kernel's first "
            "launch never waits for the kernels running", "a rank stuck inside a kernel launch (lazy loading)",
            env={"CUDA_MODULE_LOADING": "EAGER"}),
    Profile("flight-recorder", "PyTorch's flight recorder with dump on timeout, dumps in RUN/flight/",
            "find the collective that diverged",
            env={"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                 "TORCH_FR_DUMP_TEMP_FILE": "{run_dir}/flight/rank_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "{run_dir}/flight/rank_",
                 "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_ON_TIMEOUT": "1",
                 "DDPTOP_FR_DIR": "{run_dir}/flight"}),
    Profile("fail-fast", "collective timeout 60 s (set at init_process_group by the hook): hangs become errors",
            "CI and bisecting", env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, pg_timeout=60.0),
    Profile("gloo", "run the process group on gloo instead of nccl (set at init_process_group by the hook)",
            "NCCL-only failures (SIGSEGV, P2P)", backend="gloo"),
    Profile("single-gpu", "one process, one GPU (--nnodes 1 --nproc-per-node 1)", "\"does it work at all\"",
            torchrun_args={"--nnodes": "1", "--nproc-per-node": "1"}),
    Profile("fewer-workers", "halve data-loader workers (--num_workers/--num-workers/--workers in the script's arguments)",
            "data loading starving NCCL (num_workers x GPUs > cores)", script_args=dict(_WORKER_FLAGS)),
]

_KEYS = {"description": str, "for": str, "env": dict, "unset": list, "torchrun_args": dict,
         "script_args": dict, "backend": str, "pg_timeout": (int, float)}


class ProfileError(Exception):
    pass


def _line_of(text: str, name: str, key: str | None) -> int:
    """Best-effort line number of [profiles.NAME] (and KEY inside it)."""
    lines = text.splitlines()
    head = re.compile(r"^\s*\[\s*profiles\s*\.\s*\"?" + re.escape(name) + r"\"?\s*\]")
    start = next((i for i, l in enumerate(lines) if head.match(l)), None)
    if start is None:
        return 1
    if key is None:
        return start + 1
    rx = re.compile(r"^\s*\"?" + re.escape(key) + r"\"?\s*=")
    for i in range(start + 1, len(lines)):
        if lines[i].lstrip().startswith("["):
            break
        if rx.match(lines[i]):
            return i + 1
    return start + 1


def load_file(path: Path) -> list[Profile]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(f"{path}: not UTF-8 ({e})")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        raise ProfileError(f"{path}:{m.group(1) if m else '?'}: invalid TOML: {e}")
    out = []
    top = set(data) - {"profiles"}
    if top:
        k = sorted(top)[0]
        raise ProfileError(f"{path}:{_line_of_top(text, k)}: unknown key {k!r} (profiles go in [profiles.NAME] tables)")
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise ProfileError(f"{path}:1: 'profiles' must be a table of [profiles.NAME] tables")
    for name, body in profiles.items():
        where = lambda key=None: f"{path}:{_line_of(text, name, key)}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ProfileError(f"{where()}: profile name {name!r}: use letters, digits, '-', '_', '.'")
        if not isinstance(body, dict):
            raise ProfileError(f"{where()}: profiles.{name} must be a table")
        for key, val in body.items():
            want = _KEYS.get(key)
            if want is None:
                raise ProfileError(f"{where(key)}: profiles.{name}: unknown key {key!r} (known: {', '.join(sorted(_KEYS))})")
            if not isinstance(val, want) or isinstance(val, bool):
                raise ProfileError(f"{where(key)}: profiles.{name}.{key}: expected {getattr(want, '__name__', 'a number')}, got {type(val).__name__}")
        for key in ("env", "torchrun_args", "script_args"):
            for k, v in body.get(key, {}).items():
                if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                    raise ProfileError(f"{where(key)}: profiles.{name}.{key}.{k}: expected a string or number")
        for k in body.get("torchrun_args", {}):
            if not k.startswith("-"):
                raise ProfileError(f"{where('torchrun_args')}: profiles.{name}.torchrun_args: {k!r} is not an option (--name)")
        if "backend" in body and body["backend"] not in ("gloo", "nccl", "mpi", "ucc"):
            raise ProfileError(f"{where('backend')}: profiles.{name}.backend: {body['backend']!r} is not a process-group backend")
        if "description" not in body:
            raise ProfileError(f"{where()}: profiles.{name}: missing key 'description'")
        out.append(Profile(
            name, body["description"], body.get("for", ""),
            {k: str(v) for k, v in body.get("env", {}).items()},
            tuple(str(x) for x in body.get("unset", [])),
            {k: str(v) for k, v in body.get("torchrun_args", {}).items()},
            {k: str(v) for k, v in body.get("script_args", {}).items()},
            body.get("backend"), float(body["pg_timeout"]) if "pg_timeout" in body else None, str(path)))
    return out


def _line_of_top(text: str, key: str) -> int:
    for i, l in enumerate(text.splitlines()):
        if re.match(r"^\s*\[?\s*\"?" + re.escape(key), l):
            return i + 1
    return 1


def config_files() -> list[Path]:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return [Path(base) / "ddptop" / "profiles.toml", Path.cwd() / "ddptop.toml"]


# NCCL's variables for the transports between the GPUs of one node (peer-to-peer, shared memory): a profile
# that sets only these changes nothing in a job whose every node runs one rank
INTRA_NODE = frozenset({"NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE"})


def in_effect(profiles: dict[str, Profile], env: Mapping[str, str], run_dir: str | Path | None = None,
              torchrun: TorchrunOptions | None = None) -> set[str]:
    """The profiles that would change nothing in a job run with ``env``: every
    variable they set already has their value there, and they do nothing
    else (no variable removed, no argument, backend or timeout).  An alarm
    does not suggest them: the job already runs with them (its own
    environment, or a profile under another name).  A value naming
    ``{run_dir}`` is compared as the launch made it for ``run_dir`` (the run's
    own directory).

    ``torchrun``: the attempt's torchrun options (``parse_torchrun_options``:
    its ``--nnodes`` and ``--nproc-per-node``, absent: torchrun's default, 1),
    which give the job its shape; with them, also the profiles that
    shape leaves nothing to change: torchrun options the job already has
    (single-gpu for a job of one process), and the variables of the
    transports between one node's GPUs (INTRA_NODE: p2p-off, shm-off) where
    each node runs one rank."""
    shape = None if torchrun is None else {"--nnodes": torchrun.nnodes or "1",
                                           "--nproc-per-node": torchrun.nproc_per_node or "1"}
    one_a_node = shape is not None and shape["--nproc-per-node"] == "1"
    out = set()
    for name, p in profiles.items():
        if p.unset or p.script_args or p.backend or p.pg_timeout is not None or not (p.env or p.torchrun_args):
            continue
        env_same = all(env.get(k) == v or (one_a_node and k in INTRA_NODE)
                       for k, v in (p.env_for(run_dir) if run_dir is not None else p.env).items())
        args_same = not p.torchrun_args or (shape is not None and all(
            shape.get(k.replace("_", "-")) == v for k, v in p.torchrun_args.items()))
        if env_same and args_same:
            out.add(name)
    return out


def load_all(files: list[Path] | None = None) -> dict[str, Profile]:
    """Built-ins, overridden in order by the user's and the project's files."""
    out = {p.name: p for p in BUILTIN}
    for f in config_files() if files is None else files:
        if f.is_file():
            for p in load_file(f):
                out[p.name] = p
    return out


def resolve(names: list[str], files: list[Path] | None = None) -> list[Profile]:
    allp = load_all(files)
    missing = [n for n in names if n not in allp]
    if missing:
        raise ProfileError(f"unknown profile {missing[0]!r}; known: {', '.join(allp)}")
    return [allp[n] for n in names]


def rewrite_script_args(args: list[str], rules: dict[str, str]) -> list[str]:
    """Apply script-argument rewrites: ``--opt VALUE`` / ``--opt=VALUE``; "half" halves."""
    out = list(args)

    def new(old: str, rule: str) -> str:
        if rule == "half":
            try:
                return str(max(0, int(old) // 2))
            except ValueError:
                return old
        return rule

    for i, a in enumerate(out):
        name, eq, val = a.partition("=")
        if name in rules:
            if eq:
                out[i] = f"{name}={new(val, rules[name])}"
            elif i + 1 < len(out):
                out[i + 1] = new(out[i + 1], rules[name])
    return out


def format_table(profiles: dict[str, Profile]) -> str:
    rows = [("name", "what it does", "for", "source")]
    rows += [(p.name, p.description, p.for_, p.source) for p in profiles.values()]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}" for r in rows)
