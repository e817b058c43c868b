"""Command line: `ddptop [OPTIONS] torchrun ...` and `ddptop attach RUN`.

Only argparse and the core are imported here; the Textual UI is imported
lazily, so `ddptop --help` stays fast.

One module, though over 500 lines: it is the command line, one parser and one
short function per sub-command that hands over to the core (the work itself
lives in ``core/``); split, the sub-commands' shared options and their lazy
imports would be written twice.
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys

USAGE = """\
ddptop [OPTIONS] torchrun [TORCHRUN OPTIONS] SCRIPT [SCRIPT ARGS]
       ddptop [OPTIONS] attach [RUN | HOST[:RUN]... | [HOST] --pid PID] [--hosts-file F] [--slurm JOBID]
       ddptop diagnose PATH|RUN... [--json]
       ddptop profiles [--json]
       ddptop doctor [--json] [--workers N] [--master-port P]
       ddptop bench p2p [--json] [--timeout S] [--sizes B,...]
       ddptop [OPTIONS] fix torchrun [TORCHRUN OPTIONS] SCRIPT [SCRIPT ARGS]
       ddptop runs [--json]
       (each sub-command answers --help)"""

EPILOG = """\
examples:
  ddptop torchrun --nproc-per-node 2 examples/train_ddp.py --steps 200
  ddptop --headless torchrun --nproc-per-node 2 train.py   # CI / SLURM
  ddptop --json torchrun --standalone --nproc-per-node 8 train.py --lr 3e-4
  ddptop attach latest                                      # re-open a run
  ddptop attach gpu-node-3                                  # over your own ssh
  ddptop --headless attach node1 node2 --run RUN            # a multi-node job
  ddptop diagnose latest                                    # post-mortem (a run id, a path)

Everything after the word `torchrun` goes to torchrun unchanged; ddptop adds
only --log-dir RUN/logs --redirects 3 (and PYTHONUNBUFFERED=1) to capture
every rank's output in the run journal.  Runs live under
$XDG_STATE_HOME/ddptop/runs (default ~/.local/state/ddptop/runs).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddptop",
        usage=USAGE,
        description="Launch and watch PyTorch distributed (torchrun) jobs live.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--run` is not `--run-dir`
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.add_argument("--run-dir", metavar="DIR", help="journal directory for this launch (created 0700)")
    p.add_argument("--headless", action="store_true", help="no UI: print merged rank-prefixed output and events")
    p.add_argument("--json", action="store_true", help="no UI: print one JSON event per line")
    p.add_argument("--gpu", choices=["auto", "sim", "none"], default="auto",
                   help="GPU telemetry: auto = NVML when a driver is present, else none; "
                        "sim = SIMULATED GPUs (one per local rank, utilisation = rank CPU use) for machines without one")
    p.add_argument("--sample-interval", type=float, default=1.0, metavar="S",
                   help="telemetry sampling period in seconds (default 1)")
    p.add_argument("--stall-after", type=float, metavar="S",
                   help="call it a stall after S seconds without progress (default: learned from the step interval)")
    p.add_argument("--on-stall", choices=["alarm", "kill", "relaunch"], default="alarm",
                   help="alarm (default); kill: stop a stalled job and exit 124; "
                        "relaunch: relaunch with the alarm's first untried suggested profile")
    p.add_argument("--max-relaunches", type=int, default=3, metavar="N", help="with --on-stall relaunch (default 3)")
    p.add_argument("--profile", action="append", default=[], metavar="NAME",
                   help="apply a launch profile (repeatable, applied in order); `ddptop profiles` lists them")
    p.add_argument("--notify-cmd", metavar="CMD",
                   help="run CMD (split like a shell would, never through a shell) on each alarm, "
                        "with the alarm as JSON on stdin and DDPTOP_ALARM_* in its environment")
    p.add_argument("--no-inject", action="store_true",
                   help="do not put ddptop's step hook (a sitecustomize) on the ranks' PYTHONPATH")
    p.add_argument("--fix-steps", type=int, default=20, metavar="K", help="ddptop fix: steps of progress that count as working")
    p.add_argument("--fix-time", type=float, default=180, metavar="S", help="ddptop fix: time limit of one smoke attempt")
    p.add_argument("--theme", metavar="NAME", help="UI theme (ddptop-dark, ddptop-light, or any Textual theme)")
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def _err(msg: str) -> int:
    print(f"ddptop: error: {msg}", file=sys.stderr)
    return 2


READERS_WAIT = 5.0  # seconds a launching ddptop waits, at the end, for attached agents to send the run's end


def _import_ui() -> None:
    """The UI's modules (Textual's), the full screen's widgets too: imported while a hosted session's process
    starts, when there is a screen."""
    if sys.stdout.isatty():
        import ddptop.ui.app  # noqa: F401
        import ddptop.ui.screen_body  # noqa: F401


def _watch(session, args) -> int:
    """Show a ``JobSession`` (headless, JSON or the UI) to its end; what ddptop exits with."""
    try:
        return _watch_inner(session, args)
    finally:
        session.close()  # an attachment's ssh links; the job itself is untouched


def _watch_inner(session, args) -> int:
    hint = session.location.attach_hint
    if args.headless or args.json:
        from ddptop.headless import run_headless

        code = run_headless(session, json_mode=args.json)
        if session.error:
            print(f"ddptop: error: {session.error}", file=sys.stderr)
            return 2
        return code
    if not sys.stdout.isatty():
        return _err("no terminal for the UI: use --headless or --json")
    from ddptop.ui.app import make_app

    app = make_app(session, theme=args.theme, first_frame=True)
    result = app.run()
    if result == "detach":
        print(f"ddptop: detached; the job keeps running. Re-attach with: {hint}")
        return 0
    if result == "fix":
        return _fix_after_ui(session, args)
    if result == "stop":
        from ddptop.headless import run_headless

        print("ddptop: stopping the job...", file=sys.stderr)
        # drain quietly until the job has ended
        import io

        code = run_headless(session, json_mode=False, out=io.StringIO())
        print(f"ddptop: job stopped (exit code {code}); journal: {session.location}")
        return code
    if session.error:
        print(f"ddptop: error: {session.error}", file=sys.stderr)
        return 2
    st = session.exit_status()
    final = session.final_state
    code_s = str(st.code) if st.code is not None else f"unknown: {st.reason}"
    print(f"ddptop: job {final.state if final else 'ended'} (exit code {code_s}); journal: {session.location}")
    return st.exit_with


def _fix_after_ui(session, args) -> int:
    """The UI's F key: the job has been stopped (or had ended); search for a profile."""
    import io

    from ddptop.core.run.profiles import ProfileError, resolve
    from ddptop.core.tools.fix import main as fix
    from ddptop.headless import run_headless

    if not session.finished:
        print("ddptop: stopping the job...", file=sys.stderr)
        run_headless(session, json_mode=False, out=io.StringIO())  # drain quietly until it has ended
    meta = session.meta
    if meta is None:
        return _err("this job's command is not known: nothing to run again")
    from ddptop.core.model.session_protocol import LocalRun
    from ddptop.core.run import journal
    from ddptop.core.run.profiles import mask_argv

    loc = session.location
    cmd = journal.real_argv(loc.run_dir, meta)[1] if isinstance(loc, LocalRun) else list(meta.user_command)
    try:
        base = resolve(list(meta.profiles or []))
    except ProfileError as e:
        return _err(str(e))
    print(f"ddptop: searching for a profile that works: ddptop fix {shlex.join(mask_argv(cmd))}", file=sys.stderr)
    return fix(cmd, base, json_mode=False, steps=args.fix_steps, time_limit=args.fix_time, gpu=args.gpu,
               stall_after=args.stall_after)


def _slurm_hosts(jobid: str) -> list[str]:
    import subprocess

    def run(*argv):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            raise ValueError(f"--slurm needs `{argv[0]}` (SLURM's tools) on the PATH")
        except subprocess.TimeoutExpired:
            raise ValueError(f"`{' '.join(argv)}` did not answer in 30 s")
        if r.returncode != 0:
            raise ValueError(f"`{' '.join(argv)}` failed: {r.stderr.strip() or r.returncode}")
        return r.stdout

    nodelist = run("squeue", "-h", "-j", jobid, "-o", "%N").strip()
    if not nodelist:
        raise ValueError(f"SLURM job {jobid} has no nodes (not running?)")
    hosts = run("scontrol", "show", "hostnames", nodelist).split()
    if not hosts:
        raise ValueError(f"scontrol gave no host names for {nodelist!r}")
    return hosts


FIX_HELP = """\
usage: ddptop [--json] [--fix-steps K] [--fix-time S] [--profile NAME] fix torchrun [TORCHRUN OPTIONS] SCRIPT [ARGS]

Find the launch profile that makes a hanging or crashing job work: short smoke
attempts of the same command, as given, then the profiles its first failure
suggests, then p2p-off, shm-off, ib-off, gloo, fewer-workers, then 2 ranks and 1,
each until K steps of progress on every rank (--fix-steps, default 20), a
failure, a stall, or S seconds (--fix-time, default 180). It stops at the first
that works and prints the command to use. Each attempt keeps its own journal.
Exit 0: a working profile found."""

ATTACH_EPILOG = """\
with no RUN, HOST or --pid:
  the newest ddptop run if it is still running (its supervisor is alive);
  otherwise, if exactly one torchrun that ddptop did not launch is running for
  you on this machine, that one (ddptop says so on stderr); if several are, they
  are listed and ddptop exits 2: pick one with --pid; if none is, the newest
  ddptop run (finished), to read it again.

a job ddptop did not launch (--pid PID, or found as above):
  PID is torchrun (python -m torch.distributed.run) or any process under it (a
  rank, a data-loader worker); a process with RANK in its environment and no
  torchrun above it is watched as a one-rank job.  A torchrun that ddptop did
  launch opens its run journal instead.  ddptop reads each rank's log files when
  torchrun has --log-dir and --redirects or --tee, and else the file a rank's (or
  torchrun's) stdout/stderr goes to, from its last 64 KiB; a terminal, a pipe or
  a socket cannot be read from outside, and ddptop says so, with the remedy.
  ddptop never stops or relaunches such a job: in the UI, stop and relaunch are
  refused; with --headless/--json, Ctrl-C (SIGINT/SIGTERM) only detaches (exit
  130), the job keeps running.  Its exit code cannot be known (only torchrun's
  parent can wait for it): once the job has ended, ddptop exits 1 if it saw a
  rank crash or torchrun's failure report in the output, else 3 (ended, exit
  status unknown); never 0.
"""


def cmd_attach(rest: list[str], args) -> int:
    from ddptop.core.sessions.factory import (
        AttachRequest,
        K8sRequest,
        OpenError,
        WatchOptions,
        open_target,
        reaches_nodes,
    )

    ap = argparse.ArgumentParser(prog="ddptop attach", formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False,
                                 epilog=ATTACH_EPILOG, description=(
        "Watch a running (or finished) job: a local ddptop run (id, directory or `latest`), the ddptop runs on\n"
        "remote nodes over your own ssh (HOST or HOST:RUN; several hosts make one view), or a torchrun job on\n"
        "this machine that ddptop did not launch (--pid)."))
    ap.add_argument("targets", nargs="*", metavar="RUN|HOST[:RUN]")
    ap.add_argument("--pid", type=int, metavar="PID",
                    help="a torchrun job ddptop did not launch: torchrun's pid or any rank's, on this machine, "
                         "or with one HOST on that node (over ssh; also HOST:pid:PID)")
    ap.add_argument("--run", help="run id on every host (default: each host's newest run)")
    ap.add_argument("--hosts-file", metavar="F", help="hosts, one per line (# comments)")
    ap.add_argument("--slurm", metavar="JOBID", help="the nodes of this SLURM job (squeue + scontrol), each reached "
                    "through `srun --jobid JOBID --overlap` when srun is here (--via ssh: over ssh)")
    ap.add_argument("--via", choices=("auto", "ssh", "srun"), default="auto",
                    help="how to reach a SLURM job's nodes (default: srun when it is on the PATH, else ssh)")
    ap.add_argument("--k8s", metavar="NAME", help="the pods of a training job on Kubernetes (a JobSet or Kubeflow "
                    "TrainJob, a PyTorchJob, a Volcano job, an indexed Job), each a node, through kubectl exec")
    ap.add_argument("-l", "--selector", metavar="SELECTOR", help="instead of --k8s NAME: the Kubernetes pods of "
                    "this label selector (key=value[,key=value])")
    ap.add_argument("-n", "--namespace", metavar="NS", default="", help="the pods' namespace (kubectl -n)")
    ap.add_argument("--context", metavar="CTX", default="", help="the kubeconfig context (kubectl --context)")
    ap.add_argument("--logs-only", action="store_true",
                    help="with --k8s/-l: follow the pods' logs through kubectl logs, analysed here (for an image "
                         "without ddptop: no GPU pane, no stacks)")
    ap.add_argument("-c", "--container", metavar="NAME", default="",
                    help="the training container (default: pytorch, node or trainer, else the pod's first)")
    ap.add_argument("--restart-wait", metavar="S", type=float, default=None,
                    help="with --k8s/-l: how long a pod whose run failed is waited for to start its next attempt "
                         "when the cluster does not say one is coming (default 120)")
    ap.add_argument("--ssh", metavar="CMD", help="ssh command line (default: ssh, or $DDPTOP_SSH)")
    ap.add_argument("--remote-ddptop", metavar="CMD",
                    help="ddptop on the remote nodes (default: ddptop, or $DDPTOP_REMOTE)")
    ap.add_argument("--headless", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(rest)
    args.headless = args.headless or a.headless
    args.json = args.json or a.json

    hosts: list[str] = []
    try:
        if a.hosts_file:
            try:
                with open(a.hosts_file) as f:
                    hosts += [l.split("#")[0].strip() for l in f if l.split("#")[0].strip()]
            except OSError as e:
                return _err(f"--hosts-file: {e}")
            if not hosts:
                return _err(f"--hosts-file {a.hosts_file}: no host in it")
        slurm_hosts = _slurm_hosts(a.slurm) if a.slurm else []
    except ValueError as e:
        return _err(str(e))
    if (a.k8s or a.selector) and (a.targets or hosts or a.slurm or a.pid is not None):
        return _err("--k8s/-l name the pods to watch: no HOST, RUN, --pid, --hosts-file or --slurm with them")
    if a.k8s and a.selector:
        return _err("--k8s NAME or -l SELECTOR, not both")
    if a.via != "auto" and not a.slurm:
        return _err("--via chooses how to reach a --slurm job's nodes")
    k8s_req = K8sRequest(name=a.k8s or "", selector=a.selector or "", namespace=a.namespace, context=a.context,
                         container=a.container, logs_only=a.logs_only,
                         **({"restart_wait": a.restart_wait} if a.restart_wait is not None else {})
                         ) if (a.k8s or a.selector) else None
    if k8s_req is None and (a.namespace or a.context or a.container or a.logs_only or a.restart_wait is not None):
        return _err("-n, --context, -c, --logs-only and --restart-wait go with --k8s NAME or -l SELECTOR")
    if a.restart_wait is not None and not 0 <= a.restart_wait <= 86400:
        return _err(f"--restart-wait {a.restart_wait:g}: seconds, from 0 to 86400")
    req = AttachRequest(targets=tuple(a.targets), pid=a.pid, run=a.run, hosts=tuple(hosts),
                        ssh=tuple(shlex.split(a.ssh)) if a.ssh else None, remote_cmd=a.remote_ddptop,
                        options=WatchOptions(gpu=args.gpu, stall_after=args.stall_after,
                                             sample_interval=args.sample_interval),
                        slurm_job=a.slurm, slurm_hosts=tuple(slurm_hosts), via=a.via, k8s=k8s_req)
    try:
        if args.headless or args.json or not reaches_nodes(req):
            opened = open_target(req)
        else:  # the UI of nodes: their links and analysis in a process of their own (a GIL and a core of their own)
            from ddptop.core.sessions.hosted import HostedError, HostedSession

            try:
                opened = HostedSession.start(functools.partial(open_target, req), meanwhile=_import_ui)
            except HostedError as e:
                return _err(str(e))
    except OpenError as e:
        return _err(str(e))
    for note in opened.notes:
        print(f"ddptop: {note}", file=sys.stderr)
    return _watch(opened.session, args)


def _sub_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The parser of a small sub-command: its own --help, unknown options refused."""
    return argparse.ArgumentParser(prog=f"ddptop {name}", description=description, allow_abbrev=False)


def cmd_runs(rest: list[str], args) -> int:
    import json as _json

    from ddptop.core.model import run_dirs
    from ddptop.core.run import journal

    ap = _sub_parser("runs", "The runs in the runs directory, oldest first: id, state, command. "
                             "Any id (or `latest`) can be given to `ddptop attach` or `ddptop diagnose`.")
    ap.add_argument("--json", action="store_true", help="one JSON object per run")
    a = ap.parse_args(rest)
    home = run_dirs.runs_home()
    runs = sorted((d for d in home.glob("*") if (d / run_dirs.META).is_file()), key=lambda d: d.stat().st_mtime)
    if not runs:
        print(f"ddptop: no runs in {home}", file=sys.stderr)
    for d in runs:
        st = journal.run_state(d)
        meta = journal.read_json(d / run_dirs.META)
        cmd = meta.get("user_command") if isinstance(meta, dict) else None
        if args.json or a.json:
            print(_json.dumps({"id": d.name, "state": st.state, "dir": str(d),
                               "command": cmd if isinstance(cmd, list) else None}))
        else:
            print(f"{d.name}\t{st.state}\t{' '.join(map(str, cmd)) if isinstance(cmd, list) else '?'}")
    return 0


# sub-commands after which ddptop's own options are still ddptop's (up to a `torchrun`)
_HOISTED = ("fix", "attach", "diagnose", "doctor", "bench", "runs", "profiles")


def _hoist(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """ddptop's own options given after a sub-command (``ddptop fix --json torchrun
    ...``) are taken out of the sub-command's words, in place, and applied; never
    after the word ``torchrun`` (or ``--``), where everything is torchrun's."""
    cmd = args.command
    if not cmd or cmd[0] not in _HOISTED:
        return
    takes_value = {s: a.nargs != 0 for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")}
    taken: list[str] = []
    rest = [cmd[0]]
    i = 1
    while i < len(cmd):
        tok = cmd[i]
        if tok == "--" or os.path.basename(tok) == "torchrun":
            rest += cmd[i:]
            break
        name = tok.split("=", 1)[0]
        if name in takes_value:
            n = 2 if takes_value[name] and "=" not in tok else 1
            taken += cmd[i:i + n]
            i += n
            continue
        rest.append(tok)
        i += 1
    if not taken:
        return
    given = parser.parse_args(taken)
    default = parser.parse_args([])
    for k, v in vars(given).items():
        if k == "command" or v == getattr(default, k):
            continue
        setattr(args, k, getattr(args, k) + v if isinstance(v, list) else v)
    args.command = rest


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`ddptop diagnose RUN | head`): stop quietly, as other command-line tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    from ddptop.core.model.settings import SettingError, settings

    try:
        settings()  # a malformed DDPTOP_* variable is said now, naming it, not deep inside a thread
    except SettingError as e:
        parser.error(str(e))
    _hoist(parser, args)
    if args.version:
        from ddptop import __version__

        print(f"ddptop {__version__}")
        return 0
    cmd = args.command
    if not cmd:
        parser.print_usage(sys.stderr)
        return _err("nothing to do: give `torchrun ...` or `attach RUN`")
    if cmd[0] == "attach":
        return cmd_attach(cmd[1:], args)
    if cmd[0] == "agent":
        from ddptop.core.sessions.agent import main as agent

        code = agent(cmd[1:])
        sys.stdout.flush()
        os._exit(code)  # no waiting on the stdin reader thread
    if cmd[0] == "runs":
        return cmd_runs(cmd[1:], args)
    if cmd[0] == "bench":
        if cmd[1:2] in (["-h"], ["--help"]):
            print("usage: ddptop bench p2p [--json] [--timeout S] [--sizes B,B,...] [--ranks N] [--copy-mb M]\n\n"
                  "GPU peer-to-peer copy and all-reduce bandwidth, each test in its own process under a timeout.\n"
                  "`ddptop bench p2p --help` for its options.")
            return 0
        if cmd[1:2] != ["p2p"]:
            return _err("usage: ddptop bench p2p [--json] [--timeout S] [--sizes B,B,...] [--ranks N] [--copy-mb M]")
        from ddptop.core.tools.p2p_bench import (
            main as bench_p2p,  # torch only in the worker processes it starts
        )

        return bench_p2p(cmd[2:] + (["--json"] if args.json and "--json" not in cmd else []))
    if cmd[0] == "fix":
        rest = cmd[1:]
        if rest[:1] in (["-h"], ["--help"]):
            print(FIX_HELP)
            return 0
        if not rest or os.path.basename(rest[0]) != "torchrun":
            return _err("usage: ddptop [--json] [--fix-steps K] [--fix-time S] fix torchrun [TORCHRUN OPTIONS] SCRIPT [ARGS]")
        from ddptop.core.run.launcher import LaunchError, plan_launch
        from ddptop.core.run.profiles import ProfileError, resolve
        from ddptop.core.tools.fix import main as fix

        try:
            base = resolve(args.profile)
            import tempfile
            plan_launch(rest, __import__("pathlib").Path(tempfile.gettempdir()))  # check before starting anything
        except (ProfileError, LaunchError) as e:
            return _err(str(e))
        return fix(rest, base, json_mode=args.json, steps=args.fix_steps, time_limit=args.fix_time,
                   gpu=args.gpu, stall_after=args.stall_after)
    if cmd[0] == "profiles":
        import json as _json

        from ddptop.core.run.profiles import ProfileError, format_table, load_all

        ap = _sub_parser("profiles", "The launch profiles: the built-in ones, then those of "
                                     "~/.config/ddptop/profiles.toml and ./ddptop.toml (a later one of the same name "
                                     "wins). Apply one with `ddptop --profile NAME torchrun ...`.")
        ap.add_argument("--json", action="store_true", help="the profiles as a JSON list")
        a = ap.parse_args(cmd[1:])
        try:
            allp = load_all()
        except ProfileError as e:
            return _err(str(e))
        if args.json or a.json:
            print(_json.dumps([p.to_dict() for p in allp.values()], indent=2))
        else:
            print(format_table(allp))
        return 0
    if cmd[0] == "doctor":
        from ddptop.core.tools.doctor import main as doctor

        return doctor(cmd[1:] + (["--json"] if args.json and "--json" not in cmd else []))
    if cmd[0] == "diagnose":
        ap = _sub_parser("diagnose", "Post-mortem of a finished (or failed) job: the root cause, the rank that "
                                     "failed first, and what to try. Exit 0: no failure found, 1: a failure found.")
        ap.add_argument("paths", nargs="+", metavar="PATH|RUN",
                        help="a ddptop run (directory, id or `latest`), a torchrun --log-dir, or log files "
                             "(put -- before a path that starts with -)")
        ap.add_argument("--json", action="store_true", help="the verdict as JSON")
        a = ap.parse_args(cmd[1:])
        rest = a.paths
        from ddptop.core.tools.diagnose import main as diagnose

        def path_of(ref: str) -> str:
            """A path as given; else a run id or `latest`, as for attach."""
            from ddptop.core.model.run_dirs import JournalError
            from ddptop.core.run.journal import resolve_run

            if os.path.exists(ref):
                return ref
            try:
                return str(resolve_run(ref))
            except JournalError:
                return ref  # (diagnose says it does not exist)

        try:
            return diagnose([path_of(r) for r in rest], json_mode=args.json or a.json)
        except FileNotFoundError as e:
            return _err(str(e))
    if os.path.basename(cmd[0]) == "torchrun":
        from ddptop.core.run.profiles import ProfileError, resolve
        from ddptop.core.sessions.factory import OpenError, open_launch

        try:
            profiles = resolve(args.profile)
        except ProfileError as e:
            return _err(str(e))
        try:
            session = open_launch(cmd, args.run_dir, gpu=args.gpu, sample_interval=args.sample_interval,
                                  stall_after=args.stall_after, on_stall=args.on_stall,
                                  inject=not args.no_inject,
                                  notify_cmd=shlex.split(args.notify_cmd) if args.notify_cmd else None,
                                  profiles=profiles, max_relaunches=args.max_relaunches).session
        except OpenError as e:
            return _err(str(e))
        if not (args.headless or args.json):
            print(f"ddptop: run {session.location}", file=sys.stderr)
        code = _watch(session, args)
        from ddptop.core.model.session_protocol import LocalRun

        if isinstance(session.location, LocalRun):
            from ddptop.core.run import journal

            # agents streaming the run to `ddptop attach` clients send its end before this process exits (in a
            # container, this process is the first, and its exit ends them)
            journal.wait_for_readers(session.location.run_dir, READERS_WAIT)
        return code
    return _err(f"unknown command {cmd[0]!r}: expected `torchrun ...`, `attach RUN|HOST`, `diagnose PATH`, "
                f"`profiles`, `fix torchrun ...`, `agent` or `runs`")


if __name__ == "__main__":
    sys.exit(main())
