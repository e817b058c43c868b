# ddptop's step hook, put on the PYTHONPATH of ranks that ddptop launches.
#
# When the training script imports torch.optim, register torch's global
# optimizer-step post-hook, which counts optimizer steps and publishes the
# count and time into the run journal (one pwrite per step).  When it imports
# torch's data loader, count every batch drawn from any DataLoader iterator
# (training and evaluation alike), and follow the model's phase: train/eval
# (Module.train/eval) and save (inside torch.save); the count, time and phase
# are published at most every 50 ms, and at once when the phase changes.  Any failure
# disables the hook quietly, with a note in the journal; the script is never
# broken.  Then chain to whatever sitecustomize was there before us.
import os
import sys


def _ddptop_merged_dump(blobs):
    """One flight-recorder dump (torch's pickle) of several: their entries, each once, and their groups'
    config and status (the first dump's where both name a group)."""
    if len(blobs) == 1:
        return blobs[0]
    import pickle

    dumps = [d for d in (pickle.loads(b) for b in blobs) if isinstance(d, dict)]  # torch's own, in its process
    if not dumps:
        raise ValueError("no flight-recorder dump")
    out = dict(dumps[0])
    entries, seen = [], set()
    for d in dumps:
        for e in d.get("entries") or []:
            pg = e.get("process_group")
            key = (e.get("pg_id"), tuple(map(str, pg)) if isinstance(pg, (list, tuple)) else str(pg),
                   e.get("collective_seq_id"), e.get("p2p_seq_id"), e.get("profiling_name"))
            if key not in seen:
                seen.add(key)
                entries.append(e)
    out["entries"] = entries
    for k in ("pg_config", "pg_status"):
        merged = {}
        for d in dumps:
            for name, v in (d.get(k) or {}).items():
                merged.setdefault(name, v)
        out[k] = merged
    return pickle.dumps(out)


def _ddptop_install():
    beat_dir = os.environ.get("DDPTOP_BEAT_DIR")
    rank = os.environ.get("RANK")
    if not beat_dir or rank is None:
        return
    import importlib.abc
    import importlib.machinery
    import time
    import weakref

    state = {"fd": None, "n": 0, "off": False}

    def note(msg):
        try:
            with open(os.path.join(beat_dir, f"note.{rank}"), "a") as f:
                f.write(msg + "\n")
        except OSError:  # the journal is gone or full: nowhere left to say it
            pass

    def on_step(optimizer, args, kwargs):
        if state["off"]:
            return
        try:
            state["n"] += 1
            if state["fd"] is None:
                state["fd"] = os.open(os.path.join(beat_dir, f"hook.{rank}"), os.O_WRONLY | os.O_CREAT, 0o600)
            os.pwrite(state["fd"], b"%020d %.6f\n" % (state["n"], time.time()), 0)
        except Exception as e:  # noqa: BLE001 - the user's process: never break the training loop; noted
            state["off"] = True
            note(f"step hook disabled on rank {rank}: {e!r}")

    def register(module):
        try:
            module.register_optimizer_step_post_hook(on_step)
        except Exception as e:  # noqa: BLE001 - torch's internals in the user's process; noted
            note(f"step hook not installed on rank {rank}: {e!r}")

    batches = {"fd": None, "n": 0, "last": 0.0, "phase": b"train", "off": False}
    model = [None]  # a weak reference to the module whose train()/eval() was called last (outermost)
    _now = time.time

    def publish_batches(now):
        try:
            if batches["fd"] is None:
                batches["fd"] = os.open(os.path.join(beat_dir, f"batch.{rank}"), os.O_WRONLY | os.O_CREAT, 0o600)
            os.pwrite(batches["fd"], b"%020d %.6f %-5s\n" % (batches["n"], now, batches["phase"]), 0)
        except Exception as e:  # noqa: BLE001 - the user's process: never break the training loop; noted
            batches["off"] = True
            note(f"batch hook disabled on rank {rank}: {e!r}")

    def set_phase(phase):
        if batches["phase"] != phase and not batches["off"]:
            batches["phase"] = phase
            now = _now()
            batches["last"] = now
            publish_batches(now)

    def patch_loader(module):
        """Count every batch drawn from a DataLoader iterator (its __next__)."""
        try:
            cls = module._BaseDataLoaderIter
            real_next = cls.__next__

            def __next__(self):
                item = real_next(self)
                batches["n"] += 1
                ref = model[0]
                if ref is not None and batches["phase"] != b"save":
                    # the model's mode now: frameworks may set .training without calling train()
                    # (Lightning restores it so after a validation)
                    m = ref()
                    if m is not None:
                        # (its first child's mode: Lightning calls eval() on the DDP wrapper and restores
                        # only the wrapped module's flags after a validation, leaving the wrapper's False)
                        inner = next(iter(m._modules.values()), None) if getattr(m, "_modules", None) else None
                        training = inner.training if inner is not None and hasattr(inner, "training") else m.training
                        if (b"train" if training else b"eval") != batches["phase"]:
                            batches["phase"] = b"train" if training else b"eval"
                            batches["last"] = -1.0
                now = _now()
                if now - batches["last"] >= 0.05 and not batches["off"]:
                    batches["last"] = now
                    publish_batches(now)
                return item

            cls.__next__ = __next__
        except Exception as e:  # noqa: BLE001 - torch's internals in the user's process; noted
            note(f"batch hook not installed on rank {rank}: {e!r}")

    def patch_module(module):
        """The model's phase: the outermost Module.train(mode) / eval() call says it."""
        try:
            cls = module.Module
            real_train = cls.train
            depth = [0]

            def train(self, mode=True):
                depth[0] += 1
                try:
                    return real_train(self, mode)
                finally:
                    depth[0] -= 1
                    if depth[0] == 0:
                        try:
                            model[0] = weakref.ref(self)
                        except TypeError:
                            model[0] = None
                        set_phase(b"train" if mode else b"eval")

            cls.train = train
        except Exception as e:  # noqa: BLE001 - torch's internals in the user's process; noted
            note(f"phase hook not installed on rank {rank}: {e!r}")

    def patch_save(module):
        """Inside torch.save: a rank writing a checkpoint is alive."""
        try:
            real_save = module.save

            def save(*args, **kwargs):
                before = batches["phase"]
                set_phase(b"save")
                try:
                    return real_save(*args, **kwargs)
                finally:
                    set_phase(before)

            save.__doc__, save.__name__, save.__wrapped__ = real_save.__doc__, "save", real_save
            module.save = save
        except Exception as e:  # noqa: BLE001 - torch's internals in the user's process; noted
            note(f"save hook not installed on rank {rank}: {e!r}")

    force_backend = os.environ.get("DDPTOP_PG_BACKEND")
    force_timeout = os.environ.get("DDPTOP_PG_TIMEOUT")

    def patch_init(module):
        """Override init_process_group's backend/timeout (gloo, fail-fast profiles), and say
        which NCCL the process group uses (a note: NCCL's RAS port is there from 2.24)."""
        try:
            import datetime

            c10d = sys.modules.get("torch.distributed.distributed_c10d")
            real = c10d.init_process_group

            def init_process_group(*args, **kwargs):
                args = list(args)
                changes = []
                if force_backend:
                    old = args[0] if args else kwargs.get("backend")
                    if args:
                        args[0] = force_backend
                    else:
                        kwargs["backend"] = force_backend
                    changes.append(f"backend {old!r} -> {force_backend!r}")
                if force_timeout:
                    kwargs["timeout"] = datetime.timedelta(seconds=float(force_timeout))
                    changes.append(f"timeout -> {float(force_timeout):g} s")
                if changes:
                    note(f"ddptop profile: init_process_group {', '.join(changes)}")
                out = real(*args, **kwargs)
                try:  # which NCCL (if any): whether NCCL's RAS port should answer
                    backend = str(c10d.get_backend())
                    if "nccl" in backend.lower():
                        import torch

                        v = torch.cuda.nccl.version()
                        v = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
                        note(f"process group on {backend}: NCCL version {v}")
                except Exception as e:  # noqa: BLE001 - inside the user's init_process_group: noted, never raised
                    note(f"which NCCL the process group uses is unknown on rank {rank}: {e!r}")
                return out

            c10d.init_process_group = init_process_group
            module.init_process_group = init_process_group
        except Exception as e:  # noqa: BLE001 - torch's internals in the user's process; noted
            note(f"init_process_group override failed on rank {rank}: {e!r}")

    fr_dir = os.environ.get("DDPTOP_FR_DIR")

    def flight_dumps(module):
        """flight-recorder profile: dump this rank's flight recorder into
        RUN/flight/rank_N when the supervisor asks (it touches dump.request at a
        stall).  A thread, so it answers while the main thread waits in a
        collective."""
        import threading

        req = os.path.join(fr_dir, "dump.request")

        def mtime():
            try:
                return os.stat(req).st_mtime_ns
            except OSError:
                return None

        def loop():
            seen = mtime()  # a request from an earlier attempt is not for us
            while True:
                time.sleep(0.25)
                m = mtime()
                if m is None or m == seen:
                    continue
                seen = m
                try:
                    import torch._C._distributed_c10d as c

                    # NCCL's collectives are in NCCL's own recorder, the others' (gloo; on NCCL jobs the helper
                    # group of TORCH_DISTRIBUTED_DEBUG=DETAIL) in the generic one: both, as one dump (on an H100
                    # the generic one alone held only DETAIL's gloo all_gathers, none of the job's collectives)
                    blobs, failed = [], []
                    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
                        fn = getattr(c, name, None)
                        try:
                            if fn is not None:
                                blobs.append(fn())
                        except Exception as e:  # noqa: BLE001 - one recorder missing (a build without NCCL): the other
                            failed.append(f"{name}: {e!r}")
                    if not blobs:
                        raise RuntimeError("; ".join(failed) or "no flight recorder in this torch")
                    data = _ddptop_merged_dump(blobs)
                    tmp = os.path.join(fr_dir, f".rank_{rank}.tmp")
                    with open(tmp, "wb") as f:
                        f.write(data)
                    os.replace(tmp, os.path.join(fr_dir, f"rank_{rank}"))
                except Exception as e:  # noqa: BLE001 - this thread's boundary in the user's process; noted
                    note(f"flight recorder dump failed on rank {rank}: {e!r}")

        try:
            threading.Thread(target=loop, name="ddptop-flight", daemon=True).start()
        except Exception as e:  # noqa: BLE001 - torch's internals in the user's process; noted
            note(f"flight recorder dumps not available on rank {rank}: {e!r}")

    hooks = {"torch.optim.optimizer": [register], "torch.utils.data.dataloader": [patch_loader],
             "torch.nn.modules.module": [patch_module], "torch.serialization": [patch_save]}
    hooks.setdefault("torch.distributed", []).append(patch_init)  # profiles' overrides; which NCCL
    if fr_dir:
        hooks.setdefault("torch.distributed", []).append(flight_dumps)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname not in hooks:
                return None
            after = hooks.pop(fullname)
            if not hooks:
                try:
                    sys.meta_path.remove(self)
                except ValueError:
                    pass
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                for fn in after:
                    fn(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())


try:
    _ddptop_install()
except Exception as e:  # noqa: BLE001 - Python's start-up in the user's process: said on stderr, never raised
    sys.stderr.write(f"ddptop: step hooks not installed: {e!r}\n")


def _ddptop_chain():
    """Run the sitecustomize that our directory shadows, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib

    mod = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        importlib.import_module("sitecustomize")
    except ImportError:
        if mod is not None:
            sys.modules["sitecustomize"] = mod
    except Exception as e:  # noqa: BLE001 - the user's own sitecustomize: said as Python's site.py says it
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(e).__name__}: {e}\n")
    finally:
        sys.path[:] = saved


_ddptop_chain()
