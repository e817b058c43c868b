"""What each key does: the app's actions and the worker flows behind them
(relaunch, stack dump, fix, stop), with the dialogs they open.  A mixin of
``DdptopApp`` (``app.py``), which binds the keys (``BINDINGS``) and owns the
state these read and change.

The screens a key opens (dialogs, stacks, doctor, bench) and the profiles
are imported when first opened: the first frame does not wait for them.
"""

from __future__ import annotations

import re
from pathlib import Path

from textual import work
from textual.binding import Binding
from textual.content import Content
from textual.markup import escape
from textual.widgets import Input, Static

from ddptop.core.analysis.job_state import culprits_of
from ddptop.core.model.session_protocol import LocalRun, PodLogs
from ddptop.core.sources.log_tailer import read_back
from ddptop.ui.header import env_markup
from ddptop.ui.logview import LOG_MAX_LINES, RERENDER_LINES, Line


class FilterInput(Input):
    BINDINGS = [Binding("escape", "app.clear_filter", "Clear filter", show=False)]


class PickInput(Input):
    BINDINGS = [Binding("escape", "app.close_picker", "Close", show=False)]


def pick(text: str, model) -> tuple[int | None, str]:
    """The rank a person typed: a number (``777``, ``r777``, ``rank 777``), or a
    node's name (or the start of it, when only one node starts so), whose odd
    rank out is taken first, else its lowest.  (rank, what went wrong)."""
    t = text.strip()
    num = t.lower().removeprefix("rank").removeprefix("r").strip()
    if num.isdigit():
        r = int(num)
        return (r, "") if r in model.ranks else (None, f"no rank {r} in this job")
    if not t:
        return None, "type a rank or a node"
    nodes = {info.node for info in model.ranks.values() if info.node}
    node = t if t in nodes else None
    if node is None:
        starts = sorted(n for n in nodes if n.startswith(t))
        if len(starts) == 1:
            node = starts[0]
        elif starts:
            return None, f"{len(starts)} nodes start with {t!r}: {', '.join(starts[:5])}{' …' if len(starts) > 5 else ''}"
        else:
            return None, f"no rank or node {t!r}"
    ranks = sorted(r for r, info in model.ranks.items() if info.node == node)
    odd = [r for r in ranks if r in set(culprits_of(model))]
    return (odd or ranks)[0], ""


class Commands:
    """The actions (``action_*``), their dialogs' answers and their workers (mixed into ``DdptopApp``)."""

    _relaunching: str | None
    _built: bool

    # -- actions --------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if not self._built and action in self.MAIN_ACTIONS and action != "request_quit":
            return False  # (the first frame: the full screen is being built)
        if action in self.MAIN_ACTIONS and len(self.screen_stack) > 1:
            return False
        if action == "rank" and parameters and f"r{parameters[0]}" not in self.logs.buffers:
            return None if len(self.screen_stack) <= 1 else False
        return True

    def show_pane(self, key: str) -> bool:
        return self.logs.show(key)

    def action_pane(self, key: str) -> None:
        if not self.show_pane(key):
            self.notify(f"no {key} output yet", timeout=2)

    def action_rank(self, n: int) -> None:
        if not self.show_pane(f"r{n}"):
            self.notify(f"no rank {n} yet", timeout=2)

    def action_cycle(self, step: int) -> None:
        self.logs.cycle(step)

    def action_follow(self) -> None:
        log = self.logs.active_log()
        if log is not None:
            log.auto_scroll = True
            log.scroll_end(animate=False)

    def action_toggle_wrap(self) -> None:
        wrap = self.logs.toggle_wrap()
        self.notify("long lines wrap" if wrap else "long lines are cut at the edge", timeout=2)

    def action_toggle_folding(self) -> None:
        on_ = self.logs.toggle_folding()
        self.notify("merged log: alike lines of many ranks folded into one ([r0-1023] …)" if on_
                    else "merged log: every line of every rank", timeout=3)

    def action_toggle_gpus(self) -> None:
        from ddptop.ui.gpu_pane import GpuPane

        self._gpus_hidden = not self._gpus_hidden
        pane = self.query_one("#gpu-pane", GpuPane)
        pane.set_class(self._gpus_hidden, "-hidden")
        if not self._gpus_hidden:
            self._refresh_gpus()
        self.notify("GPU pane hidden (g shows it)" if self._gpus_hidden else "GPU pane shown", timeout=2)

    def _refresh_env(self) -> None:
        try:
            panel = self.query_one("#envpanel", Static)
            if panel.has_class("-on"):
                panel.update(Content.from_markup(env_markup(self.model)))
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said once
            self._ui_error("the launch panel", e)

    def action_toggle_env(self) -> None:
        panel = self.query_one("#envpanel", Static)
        on_ = not panel.has_class("-on")
        panel.set_class(on_, "-on")
        self._refresh_env()

    def _job_ended(self) -> bool:
        return self.model.finished or self.session.finished

    def action_relaunch(self) -> None:
        control = self.session.control()
        refused = control.refused if not control.relaunch else ""  # a job ddptop did not start
        if refused:
            self.notify(refused, title="cannot relaunch", severity="warning", timeout=15)
            self._add_line(Line(-1, "note", f"relaunch refused: {refused}", "bold"))
            self._schedule_flush()
            return
        if self._relaunching is not None:
            self.notify(f"a relaunch ({self._relaunching}) is on its way", timeout=3)
            return
        from ddptop.core.run.profiles import ProfileError, load_all
        from ddptop.ui.dialogs import ProfilePicker, picker_choices

        try:
            profiles = load_all()
        except (ProfileError, OSError) as e:  # a broken or unreadable profiles file
            self.notify(f"could not read the profiles: {e}", severity="error")
            return
        choices = picker_choices(self.model, profiles)
        cur = ", ".join(self.model.profiles) or "none"
        if self._job_ended():
            title = "[b]The job has ended[/b]: pick a profile to see the command that re-runs it with it"
        else:
            title = f"[b]Relaunch with a profile[/b] (launch #{self.model.generation}, current profiles: {escape(cur)})"
        self.push_screen(ProfilePicker(choices, title), self._relaunch_chosen)

    def _relaunch_names(self, choice: str) -> list[str]:
        from ddptop.ui.dialogs import DEFAULT_CHOICE

        if choice == DEFAULT_CHOICE:
            return []
        names = list(self.model.profiles)
        if choice not in names:
            names.append(choice)
        return names

    def _rerun_hint(self, names: list[str]) -> str:
        meta = self.session.meta
        cmd = list(meta.user_command if meta is not None and meta.user_command else ["torchrun", "..."])
        try:
            import shlex

            cmd_s = shlex.join(cmd)
        except TypeError:  # a damaged meta.json with arguments that are not strings
            cmd_s = " ".join(map(str, cmd))
        flags = "".join(f"--profile {n} " for n in names)
        return f"the job has ended: re-run `ddptop {flags}{cmd_s}`"

    def _relaunch_chosen(self, result: tuple[str, str] | None) -> None:
        if not result:
            return
        choice, reason = result
        names = self._relaunch_names(choice)
        if self._job_ended():
            self.notify(self._rerun_hint(names), title="cannot relaunch", severity="warning", timeout=15)
            return
        self._relaunching = ", ".join(names) or "no profile"
        self._refresh_header()
        self._do_relaunch(names, reason)

    def action_fix(self) -> None:
        if self._stopping:
            return
        c = self.session.control()
        if not c.fix:
            if c.fix_refused:
                self.notify(c.fix_refused, title="cannot search for a fix from here", severity="warning", timeout=10)
            else:
                self.notify("this run has no command to run again", severity="warning", timeout=6)
            return
        from ddptop.ui.dialogs import FixScreen

        running = not self._job_ended()
        self.push_screen(FixScreen(running), lambda go: self._fix_chosen(go, running))

    def _fix_chosen(self, go: bool, running: bool) -> None:
        if not go:
            return
        if not running:
            self._quit("fix")
            return
        self._stopping = True
        self._refresh_header()
        self._stop_job("fix")

    def action_stacks_pane(self) -> None:
        from ddptop.ui.stacks_screen import StacksScreen

        self.push_screen(StacksScreen(self.model.stacks))

    def action_doctor(self) -> None:
        from ddptop.ui.tool_screens import DoctorScreen

        self.push_screen(DoctorScreen())

    def action_bench(self) -> None:
        from ddptop.ui.tool_screens import BenchScreen

        self.push_screen(BenchScreen())

    def action_stacks(self) -> None:
        if self._job_ended():
            self.notify("the job has ended: no stacks to capture", timeout=4)
            return
        self._do_stacks()

    @work(thread=True, exclusive=True, group="stacks", exit_on_error=False)
    def _do_stacks(self) -> None:
        try:
            r = self.session.dump_stacks()
            ok, msg = r.ok, r.message
        except Exception as e:  # noqa: BLE001 - the stacks worker thread's boundary: said in a notification
            ok, msg = False, f"stack capture failed: {type(e).__name__}: {e}"
        self.call_from_thread(self._stacks_done, ok, msg)

    def _stacks_done(self, ok: bool, message: str) -> None:
        if ok:
            self.notify("capturing every rank's Python stack (py-spy); the result shows in the merged log", timeout=5)
        else:
            self.notify(f"no stack capture: {message}", severity="warning", timeout=8)

    @work(thread=True, exclusive=True, group="relaunch", exit_on_error=False)
    def _do_relaunch(self, names: list[str], reason: str) -> None:
        try:
            r = self.session.relaunch(names, reason)
            ok, err, why = r.ok, None, r.message
        except Exception as e:  # noqa: BLE001 - the relaunch worker thread's boundary: said in the log
            ok, err, why = False, f"{type(e).__name__}: {e}", ""
        self.call_from_thread(self._relaunch_done, names, ok, err, why)

    def _relaunch_done(self, names: list[str], ok: bool, err: str | None, why: str = "") -> None:
        what = ", ".join(names) or "no profile"
        if ok:
            self.notify(f"relaunching with profiles: {what} (stopping every rank first)", timeout=4)
            self._add_line(Line(-1, "note", f"relaunch requested with profiles: {what}", "bold"))
            self._schedule_flush()
        else:
            self._relaunching = None
            if err:
                self.notify(f"relaunch failed: {err}", severity="error", timeout=10)
            elif self._job_ended() or not self.session.is_live:
                self.notify(self._rerun_hint(names), title="cannot relaunch", severity="warning", timeout=15)
            else:
                self.notify(f"relaunch failed: {why}", severity="error", timeout=10)
        self._refresh_header()

    def action_earlier(self) -> None:
        """L: the active pane's earlier lines, a thousand at a time: first those it holds but has not
        written, then, for a rank's pane that no longer holds them (a large job keeps each rank's newest),
        read back from the journal when it is on this machine."""
        key = self.logs.active_key()
        pane = self.logs.buffers.get(key)
        if pane is None:
            return
        if pane.window >= LOG_MAX_LINES - 1:
            self.notify(f"this pane shows its {pane.window:,} newest lines at most; the others are in the journal "
                        f"({self.session.location})", timeout=8)
            return
        more = min(RERENDER_LINES, LOG_MAX_LINES - 1 - pane.window)
        if pane.window >= len(pane.lines):
            if not pane.evicted:
                self.notify("no earlier lines", timeout=3)
                return
            got, why = self._read_back(pane, min(more, pane.evicted))
            if not got:
                self.notify(why, title="earlier lines", severity="warning", timeout=10)
                return
            pane.earlier(got)
            more = len(got)  # (with its separator line)
        pane.window += more
        pane.dirty = True
        self.logs.render_active(top=True)

    def _read_back(self, pane, most: int) -> tuple[list[Line], str]:
        """Up to ``most`` lines older than every line ``pane`` holds, read back from the journal: from each
        file it got lines of, those before the oldest line of it that it holds (or, holding none, all it got:
        a rank's early warnings on stderr, an earlier attempt), a block per file, the earlier attempts first,
        and why none when none."""
        loc = self.session.location
        if isinstance(loc, PodLogs):
            return [], f"the earlier lines are only in `kubectl logs` of the pods ({loc}): pods keep no journal"
        base = loc.run_dir if isinstance(loc, LocalRun) else None
        if not pane.sources:
            return [], "the lines this pane holds do not say where they are in the journal"
        ends = dict(pane.sources)
        held: set[str] = set()
        for ln in pane.lines:
            if ln.src is not None and ln.src[0] not in held:
                held.add(ln.src[0])
                ends[ln.src[0]] = ln.src[1]  # (the oldest line held of that file)
        files = {path: (Path(path) if Path(path).is_absolute() else base / path if base is not None else None)
                 for path in ends if ends[path] > 0}
        if not files:
            return [], "no earlier lines in the journal"
        if any(f is None for f in files.values()):
            return [], f"the earlier lines are in the journal on the node: {loc} ({', '.join(files)})"
        rank = int(pane.key[1:]) if pane.key.startswith("r") else None
        node = next((ln.node for ln in pane.lines if ln.node), "")

        def order(path: str) -> tuple[int, int, str]:
            m = re.search(r"attempt_(\d+)", path)
            return (int(m.group(1)) if m else 0, "stderr" in path, path)

        got: list[Line] = []
        for path in sorted(files, key=order):
            chunk = read_back(files[path], ends[path], max(1, most // len(files)))
            if not chunk.texts:
                continue
            stream = "stderr" if "stderr" in path else "stdout"
            got.append(Line(-1, "sep", f"── {len(chunk.texts):,} earlier lines of {path}, read back from the "
                                       "journal ──", "dim"))
            got += [Line(rank, stream, t, "", node, src=(path, o)) for o, t in zip(chunk.offsets, chunk.texts)]
            pane.sources[path] = chunk.offsets[0]  # (a file it holds nothing of now begins there)
        return got, "" if got else "no earlier lines in the journal"

    def action_top(self) -> None:
        log = self.logs.active_log()
        if log is not None:
            log.scroll_home(animate=False)

    def action_help(self) -> None:
        from ddptop.ui.dialogs import HelpScreen

        self.push_screen(HelpScreen())

    def action_open_picker(self) -> None:
        inp = self.query_one("#picker", PickInput)
        inp.add_class("-on")
        inp.focus()

    def action_close_picker(self) -> None:
        inp = self.query_one("#picker", PickInput)
        inp.value = ""
        inp.remove_class("-on")
        log = self.logs.active_log()
        if log is not None:
            log.focus()

    def pick_submitted(self, text: str) -> None:
        rank, why = pick(text, self.model)
        if rank is None:
            self.notify(why, timeout=3)
            return
        shown = self.show_pane(f"r{rank}")
        self.action_close_picker()
        if not shown:
            self.notify(f"no output of rank {rank} yet", timeout=2)

    def action_open_filter(self) -> None:
        inp = self.query_one("#filter", FilterInput)
        inp.add_class("-on")
        inp.focus()

    def set_filter(self, text: str) -> None:
        if self.logs.set_filter(text):
            self._refresh_header()

    def action_clear_filter(self) -> None:
        inp = self.query_one("#filter", FilterInput)
        inp.value = ""
        inp.remove_class("-on")
        self.set_filter("")
        log = self.logs.active_log()
        if log is not None:
            log.focus()

    def action_request_quit(self) -> None:
        if self._stopping:
            return
        from ddptop.ui.dialogs import QuitScreen

        if isinstance(self.screen, QuitScreen):
            return
        if self.model.finished or self.session.finished:
            self._quit("finished")
            return
        self.push_screen(QuitScreen(), self._quit_chosen)

    def _quit_chosen(self, choice: str | None) -> None:
        if choice == "detach":
            self._quit("detach")
        elif choice == "stop":
            self._stopping = True
            self._refresh_header()
            self._stop_job()

    @work(thread=True, exclusive=True, group="stop", exit_on_error=False)
    def _stop_job(self, result: str = "stop") -> None:
        refused = None
        try:
            r = self.session.stop()
            if not r.ok and (r.refused or self.session.is_live):
                refused = r.message  # a job ddptop did not start, a node out of reach: keep watching
        finally:
            if refused:
                self.call_from_thread(self._stop_refused, refused)
            else:
                self.call_from_thread(self._quit, result)

    def _stop_refused(self, why: str) -> None:
        """The session will not stop this job: say why and keep watching."""
        self._stopping = False
        self.notify(why, title="cannot stop", severity="warning", timeout=15)
        self._add_line(Line(-1, "note", f"stop refused: {why}", "bold"))
        self._schedule_flush()
        self._refresh_header()

    def _quit(self, result: str) -> None:
        self.workers.cancel_group(self, "poll")
        self.exit(result)
