"""ddptop.core.analysis.stack_dumps: py-spy (text and --json), gdb and pystack dumps read into
threads and frames, pastes of several processes split per rank, and dumps told from logs.

The fixtures follow each tool's real output: py-spy 0.4.3, gdb 13.1 and pystack 1.7.2 were run on
a small sleeping program (trimmed here; addresses and paths as they printed them), and the gdb /
pystack header forms are those of their sources (gdb's thread.c ``thread_try_catch_cmd`` and
``thread_target_id_str``, pystack's ``traceback_formatter.py`` and ``types.py``).  Fixtures that
follow the shape of dumps posted in public threads name the thread; their values are made up.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from ddptop.core.analysis.stack_dumps import (
    Frame,
    ProcessDump,
    Thread,
    format_of,
    parse_dump,
    split_processes,
)


def d(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# --------------------------------------------------------------------------- Frame


def test_frame_keeps_its_three_field_construction_and_says_what_is_native():
    f = Frame("train_step", "/w/train.py", 88)
    assert (f.function, f.file, f.line, f.native, f.named) == ("train_step", "/w/train.py", 88, False, True)
    assert Frame("cudaStreamSynchronize", "libcudart.so.12", 0).native
    assert Frame("<module>", "<string>", 1).native is False
    # gdb's "?? ()" with no library: no file, its address as function, still native
    assert Frame("0x00007f3a1c2b4f7a", "", 0).native and not Frame("0x00007f3a1c2b4f7a", "", 0).named
    # a function with no file and no address (gdb's frames of the python binary itself) is native where
    # the dump says so, and equal to the same frame built without saying it
    assert Frame("_PyEval_EvalFrameDefault", "", 0, "native").native
    assert Frame("f", "", 0, "native") == Frame("f", "", 0)
    assert Frame("f", "x.py", 1).to_dict() == {"function": "f", "file": "x.py", "line": 1}


# --------------------------------------------------------------------------- py-spy text

PYSPY_NATIVE = d("""
    Process 51234: /opt/venv/bin/python -u /w/train.py --epochs 3
    Python v3.10.12 (/usr/bin/python3.10)

    Thread 51234 (active+gil): "MainThread"
        0x7f3a1c2b4f7a (libcuda.so.535.104.05)
        0x7f3a1c2b50e1 (libcuda.so.1)
        cudaStreamSynchronize (libcudart.so.12)
        at::native::DispatchStub<void (*)(at::TensorIterator&, bool), at::native::foo_stub>::operator()<at::TensorIterator&, bool&> (libtorch_cpu.so)
        pybind11::cpp_function::initialize<void (*&)(int), void, int>::_FUN (pybind11.h:401)
        train_step (/w/train.py:88)
        <module> (/w/train.py:140)
    Thread 51301 (idle): "pt_autograd_0"
        0x7f3a2d1c8e2b (?)
        std::condition_variable::wait (condition_variable.cc:53)
    """)


def test_py_spy_native_frames_with_cxx_templates_and_unnamed_addresses():
    assert format_of(PYSPY_NATIVE) == "py-spy"
    main, auto = parse_dump(PYSPY_NATIVE)
    assert (main.name, main.id, main.state, main.gil, main.pid) == ("MainThread", 51234, "active", True, 51234)
    assert [f.function for f in main.frames[:3]] == ["0x7f3a1c2b4f7a", "0x7f3a1c2b50e1", "cudaStreamSynchronize"]
    assert [f.file for f in main.frames[:3]] == ["libcuda.so.535.104.05", "libcuda.so.1", "libcudart.so.12"]
    tmpl = main.frames[3]
    assert tmpl.function == ("at::native::DispatchStub<void (*)(at::TensorIterator&, bool), at::native::foo_stub>"
                             "::operator()<at::TensorIterator&, bool&>")
    assert (tmpl.file, tmpl.line, tmpl.native) == ("libtorch_cpu.so", 0, True)
    fun = main.frames[4]
    assert fun == Frame("pybind11::cpp_function::initialize<void (*&)(int), void, int>::_FUN", "pybind11.h", 401)
    assert fun.native
    assert [(f.function, f.line, f.native) for f in main.frames[5:]] == [("train_step", 88, False),
                                                                         ("<module>", 140, False)]
    assert (auto.state, auto.frames[0].file, auto.frames[0].native) == ("idle", "?", True)


def test_py_spy_thread_id_in_hex_and_a_thread_with_no_name():
    # a header as py-spy prints it without the OS thread id (shape of benfred/py-spy#567)
    text = d("""
        Process 7: python serve.py
        Python v3.9.16 (/usr/bin/python3.9)

        Thread 0x7F1C2A3B4700 (active): "ThreadPoolExecutor-12_3"
            _worker (concurrent/futures/thread.py:81)
        Thread 0x7F1C3B4C5800 (idle)
            wait (threading.py:312)
        """)
    a, b = parse_dump(text)
    assert (a.id, a.name, b.id, b.name) == (0x7F1C2A3B4700, "ThreadPoolExecutor-12_3", 0x7F1C3B4C5800, "")


# --------------------------------------------------------------------------- py-spy --json

def _jframe(name, filename, line, module=None):
    short = filename.rsplit("/", 1)[-1]
    return {"name": name, "filename": filename, "module": module, "short_filename": short, "line": line,
            "locals": None, "is_entry": True, "is_shim_entry": module is not None}


# py-spy 0.4.3 dump --native --json, as it printed a thread sleeping in a ctypes call (trimmed); its threads
# come newest first
PYSPY_JSON = json.dumps([
    {"pid": 6080, "thread_id": 139706335803072, "thread_name": "loader", "os_thread_id": 6082, "active": False,
     "owns_gil": False, "process_info": None,
     "frames": [_jframe("clock_nanosleep", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0,
                        "/usr/lib/x86_64-linux-gnu/libc.so.6"),
                _jframe("worker", "/tmp/hang_prog.py", 5)]},
    {"pid": 6080, "thread_id": 139706347981696, "thread_name": "MainThread", "os_thread_id": 6080, "active": False,
     "owns_gil": False, "process_info": None,
     "frames": [_jframe("0x7f0fea85ff7a", "/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2", 0,
                        "/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2"),
                # a library with debug information: filename is its C source, module the library
                _jframe("_ctypes_callproc", "/tmp/python-build/Python-3.11.7/Modules/_ctypes/callproc.c", 1262,
                        "/root/.pyenv/versions/3.11.7/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so"),
                _jframe("cudaStreamSynchronize", "/usr/local/cuda/lib64/libcudart.so.12", 0,
                        "/usr/local/cuda/lib64/libcudart.so.12"),
                _jframe("train", "/tmp/hang_prog.py", 8),
                _jframe("<module>", "/tmp/hang_prog.py", 9)]},
], indent=2)


def test_py_spy_json_native_frames_come_with_their_library_as_file():
    assert format_of(PYSPY_JSON) == "py-spy-json"
    main, loader = parse_dump(PYSPY_JSON)  # main thread first, as py-spy's text prints them
    assert (main.name, main.id, main.pid, main.state) == ("MainThread", 6080, 6080, "idle")
    assert loader.name == "loader" and loader.frames[0].file == "/usr/lib/x86_64-linux-gnu/libc.so.6"
    ffi, ctypes_, cuda, train, mod = main.frames
    assert (ffi.function, ffi.base, ffi.native, ffi.named) == ("0x7f0fea85ff7a", "libffi.so.8.1.2", True, False)
    assert (ctypes_.base, ctypes_.line, ctypes_.native) == ("_ctypes.cpython-311-x86_64-linux-gnu.so", 0, True)
    assert cuda == Frame("cudaStreamSynchronize", "/usr/local/cuda/lib64/libcudart.so.12", 0) and cuda.native
    assert (train, mod) == (Frame("train", "hang_prog.py", 8), Frame("<module>", "hang_prog.py", 9))
    assert not train.native


def test_json_after_a_label_and_broken_json():
    assert parse_dump("=== rank 0 ===\n" + PYSPY_JSON)[0].name == "MainThread"
    assert parse_dump("[not json") == [] and parse_dump("[]") == [] and format_of("[]") == ""
    assert format_of('[{"t": 1.5, "kind": "step"}]') == ""  # a JSON list that is no dump


# --------------------------------------------------------------------------- gdb

# gdb 13.1 `-batch -ex "thread apply all bt"` on the same program (trimmed), with what it prints around the
# threads: the attach, the current frame, the auto-load warning and the detach
GDB_13 = d("""
    [New LWP 6082]
    [Thread debugging using libthread_db enabled]
    Using host libthread_db library "/lib/x86_64-linux-gnu/libthread_db.so.1".
    0x00007f0feaced545 in __GI___clock_nanosleep (clock_id=clock_id@entry=0, flags=flags@entry=0, req=req@entry=0x7ffe225be160, rem=rem@entry=0x7ffe225be160) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48
    48	../sysdeps/unix/sysv/linux/clock_nanosleep.c: No such file or directory.
    warning: File "/root/.pyenv/versions/3.11.7/bin/python3.11-gdb.py" auto-loading has been declined by your `auto-load safe-path' set to "$debugdir:$datadir/auto-load".

    Thread 2 (Thread 0x7f0fea84b6c0 (LWP 6082) "python"):
    #0  0x00007f0feaced545 in __GI___clock_nanosleep (clock_id=clock_id@entry=1, flags=flags@entry=1, req=req@entry=0x7f0fea84aab0, rem=rem@entry=0x0) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48
    #1  0x00007f0feb115ada in pysleep (timeout=<optimized out>) at ./Modules/timemodule.c:2159
    #2  time_sleep (self=<optimized out>, timeout_obj=<optimized out>) at ./Modules/timemodule.c:383
    #3  0x00007f0feafa6ee2 in cfunction_vectorcall_O (func=0x7f0feab6f7e0, args=0x7f0feb3bf1e0, nargsf=<optimized out>, kwnames=<optimized out>) at Objects/methodobject.c:514
    #4  0x00007f0feaefd9c3 in _PyEval_EvalFrameDefault (tstate=<optimized out>, frame=<optimized out>, throwflag=<optimized out>) at Python/ceval.c:4769
    #5  0x00007f0feb1143ae in thread_run (boot_raw=0x55604940d870) at ./Modules/_threadmodule.c:1124
    #6  0x00007f0feaca71f5 in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442
    #7  0x00007f0fead278ec in clone3 () at ../sysdeps/unix/sysv/linux/x86_64/clone3.S:81

    Thread 1 (Thread 0x7f0feb3e8b80 (LWP 6080) "python"):
    #0  0x00007f0feaced545 in __GI___clock_nanosleep (clock_id=clock_id@entry=0, flags=flags@entry=0, req=req@entry=0x7ffe225be160, rem=rem@entry=0x7ffe225be160) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48
    #1  0x00007f0feacf1d8a in __sleep (seconds=0) at ../sysdeps/posix/sleep.c:55
    #2  0x00007f0fea85ff7a in ?? () from /lib/x86_64-linux-gnu/libffi.so.8
    #3  0x00007f0fea85fb0d in ffi_call () from /lib/x86_64-linux-gnu/libffi.so.8
    #4  0x00007f0fea87617a in _ctypes_callproc (pProc=0x7f0feacf1d50 <__sleep>, argtuple=argtuple@entry=0x7f0fea8bb1f0, flags=<optimized out>, argtypes=argtypes@entry=0x0, restype=<optimized out>, checker=checker@entry=0x0) at /tmp/python-build/Python-3.11.7/Modules/_ctypes/callproc.c:1262
    #5  0x00007f0feaefd9c3 in _PyEval_EvalFrameDefault (tstate=<optimized out>, frame=<optimized out>, throwflag=<optimized out>) at Python/ceval.c:4769
    #6  0x00007f0feb0ba217 in pymain_main (args=0x7ffe225be930) at Modules/main.c:710
    #7  0x00007f0feac4524a in __libc_start_call_main (main=main@entry=0x556010c6a050 <main>, argc=argc@entry=2, argv=argv@entry=0x7ffe225beaa8) at ../sysdeps/nptl/libc_start_call_main.h:58
    #8  0x0000556010c6a081 in _start ()
    [Inferior 1 (process 6080) detached]
    """)


def test_gdb_thread_apply_all_bt_reads_every_frame_form_main_thread_first():
    assert format_of(GDB_13) == "gdb"
    main, worker = parse_dump(GDB_13)  # gdb prints the highest thread number first; Thread 1 is the main one
    assert (main.name, main.id, main.state, main.pid) == ("python", 6080, "", 6080)
    assert (worker.name, worker.id) == ("python", 6082)
    f = main.frames
    assert f[0] == Frame("__GI___clock_nanosleep", "../sysdeps/unix/sysv/linux/clock_nanosleep.c", 48)
    assert f[2] == Frame("0x00007f0fea85ff7a", "/lib/x86_64-linux-gnu/libffi.so.8", 0) and not f[2].named
    assert f[3] == Frame("ffi_call", "/lib/x86_64-linux-gnu/libffi.so.8", 0)
    assert f[4].function == "_ctypes_callproc" and f[4].line == 1262  # arguments holding "<__sleep>" and "@entry"
    assert f[8] == Frame("_start", "", 0) and f[8].native  # the binary's own frame: no file, still native
    assert all(x.native for x in f)  # gdb prints Python code as the interpreter's C frames only
    # an inlined frame (no address) keeps its source and line
    assert worker.frames[2] == Frame("time_sleep", "./Modules/timemodule.c", 383)


# gdb's header forms: target_pid_to_str() alone (gdb < 8.3 and without libthread_db: "LWP N", a
# single-threaded process: "process N"), and thread_target_id_str() with a name and extra info; frames as
# gdb prints CUDA / NCCL waits (shapes of NVIDIA/nccl threads' hang reports and pytorch/pytorch#58239)
GDB_FORMS = d("""
    Attaching to process 4242
    [New LWP 4250]

    Thread 4 (LWP 4250 "cuda-EvtHandlr"):
    #0  0x00007fd4ca0afb41 in poll () from /lib/x86_64-linux-gnu/libc.so.6
    #1  0x00007fd4ca2d31b5 in ?? () from /lib/x86_64-linux-gnu/libcuda.so.1

    Thread 3 (Thread 0x7fd09a759000 (LWP 4249) "pt_nccl_watchdg" (Exiting)):
    #0  ncclGroupEndInternal () at group.cc:406
    #1  0x00007fd4dbc6ba38 in ncclGroupEnd () from /usr/lib/x86_64-linux-gnu/libnccl.so.2

    Thread 2 (Thread 0x7f557598d700 (LWP 4248)):
    #0  __lll_lock_wait (futex=futex@entry=0x7f76f1ed2598, private=0x0) at lowlevellock.c:52
    #1  0x00007f790845de98 in std::mutex::lock (this=0x7f76f1ed2598) at bits/std_mutex.h:100
    #2  0x00007f79088a4eac in std::unique_lock<std::mutex>::lock (this=0x7ffcac6e2d48) at bits/unique_lock.h:142

    Thread 1 (Thread 0x7fd4cb6ee000 (LWP 4242) "python"):
    #0  0x00007fd4ca0afb41 in ?? () from /lib/x86_64-linux-gnu/libcuda.so.1
    #1  0x00007fd4ca0915c2 in ?? ()
    #2  0x00007fd4dbc14c90 in ?? () from /usr/local/cuda-12.1/lib64/libcudart.so.12
    #3  0x00007fd4dbc6ba38 in cudaStreamSynchronize () from /usr/local/cuda-12.1/lib64/libcudart.so.12
    #4  0x00007f0a9f1c338a in void pybind11::cpp_function::initialize<void (*&)(int), void, int>(void (*&)(int), void (*)(int))::{lambda(pybind11::detail::function_call&)#3}::_FUN(pybind11::detail::function_call&) () from /w/venv/lib/python3.10/site-packages/torch/lib/libtorch_python.so
    #5  0x00007f0a9f46d3c6 in at::native::_local_scalar_dense_cuda(at::Tensor const&)::{lambda()#1}::operator()() const [clone .isra.0] ()
       from /w/venv/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so
    --Type <RET> for more, q to quit, c to continue without paging--
    #6  0x000055555566bcff in _PyEval_EvalFrameDefault (tstate=0x5555558bcad0, f=Frame 0x7f0a3c0b1d40, for file /w/train.py, line 88, in train_step (self=<Trainer at remote 0x7f0a3c0c2e80>, batch=(1, 2)), throwflag=0) at /usr/local/src/conda/python-3.10.12/Python/ceval.c:4231
    #7  0x000055555567b9a0 in _PyEval_EvalFrameDefault (tstate=0x5555558bcad0, f=Frame 0x7f0a3c0b1a00, for file /w/train.py, line 140, in <module> (), throwflag=0) at /usr/local/src/conda/python-3.10.12/Python/ceval.c:4231
    #8  0x0000555555739e2a in Py_BytesMain (argc=<optimized out>, argv=<optimized out>) at /usr/local/src/conda/python-3.10.12/Modules/main.c:1090
    #9  0x0000000000000000 in ?? ()
    Detaching from program: /usr/bin/python3.10, process 4242
    [Inferior 1 (process 4242) detached]
    """)


def test_gdb_header_forms_cuda_nccl_frames_templates_wrapped_lines_and_python_frames_from_arguments():
    assert format_of(GDB_FORMS) == "gdb"
    threads = parse_dump(GDB_FORMS)
    assert [(t.id, t.name) for t in threads] == [(4242, "python"), (4248, ""), (4249, "pt_nccl_watchdg"),
                                                 (4250, "cuda-EvtHandlr")]
    assert {t.pid for t in threads} == {4242} and {t.state for t in threads} == {""}
    main, lock, nccl, evt = threads
    f = main.frames
    assert f[0] == Frame("0x00007fd4ca0afb41", "/lib/x86_64-linux-gnu/libcuda.so.1", 0)
    assert f[1] == Frame("0x00007fd4ca0915c2", "", 0) and f[1].native  # "?? ()" with no library
    assert f[3] == Frame("cudaStreamSynchronize", "/usr/local/cuda-12.1/lib64/libcudart.so.12", 0)
    assert f[3].base == "libcudart.so.12"
    # a C++ name holding " (" and "(...)" of its own, without debug information: its empty "()" is the arguments
    assert f[4].function == ("void pybind11::cpp_function::initialize<void (*&)(int), void, int>(void (*&)(int), "
                             "void (*)(int))::{lambda(pybind11::detail::function_call&)#3}::_FUN"
                             "(pybind11::detail::function_call&)")
    assert f[4].base == "libtorch_python.so"
    # a line gdb wrapped ("   from ...") and its pager prompt
    assert f[5].function.endswith("::operator()() const [clone .isra.0]") and f[5].base == "libtorch_cuda.so"
    # CPython's gdb extension prints an evaluation frame's Python frame in its f= argument: it goes before it
    py = [x for x in f if not x.native]
    assert py == [Frame("train_step", "/w/train.py", 88), Frame("<module>", "/w/train.py", 140)]
    i = f.index(py[0])
    assert f[i + 1].function == "_PyEval_EvalFrameDefault" and f[i + 1].native
    assert f[-1] == Frame("0x0000000000000000", "", 0)
    assert lock.frames[0] == Frame("__lll_lock_wait", "lowlevellock.c", 52)
    assert lock.frames[2].function == "std::unique_lock<std::mutex>::lock"
    assert nccl.frames[0] == Frame("ncclGroupEndInternal", "group.cc", 406) and nccl.frames[0].native
    assert nccl.frames[1].base == "libnccl.so.2"
    assert evt.frames[1].base == "libcuda.so.1"


# `thread apply all py-bt` after `thread apply all bt`, and `py-bt-full` (gdb 13.1 with python3.11-gdb.py
# loaded, on the same program; trimmed)
GDB_PY_BT = d("""
    Thread 2 (Thread 0x7f0fea84b6c0 (LWP 6082) "python"):
    #0  0x00007f0feaced545 in __GI___clock_nanosleep (clock_id=clock_id@entry=1, flags=flags@entry=1, req=req@entry=0x7f0fea84aab0, rem=rem@entry=0x0) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48
    #1  0x00007f0feafa6ee2 in cfunction_vectorcall_O (func=<built-in method sleep of module object at remote 0x7f0feab6f470>, args=0x7f0feb3bf1e0, nargsf=<optimized out>, kwnames=<optimized out>) at Objects/methodobject.c:514
    #2  0x00007f0feaefd9c3 in _PyEval_EvalFrameDefault (tstate=<optimized out>, frame=<optimized out>, throwflag=<optimized out>) at Python/ceval.c:4769
    #3  0x00007f0feb1143ae in thread_run (boot_raw=0x55604940d870) at ./Modules/_threadmodule.c:1124

    Thread 1 (Thread 0x7f0feb3e8b80 (LWP 6080) "python"):
    #0  0x00007f0feaced545 in __GI___clock_nanosleep (clock_id=clock_id@entry=0, flags=flags@entry=0, req=req@entry=0x7ffe225be160, rem=rem@entry=0x7ffe225be160) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48
    #1  0x00007f0feaefd9c3 in _PyEval_EvalFrameDefault (tstate=<optimized out>, frame=<optimized out>, throwflag=<optimized out>) at Python/ceval.c:4769
    #2  0x0000556010c6a081 in _start ()

    Thread 2 (Thread 0x7f0fea84b6c0 (LWP 6082) "python"):
    Traceback (most recent call first):
      <built-in method sleep of module object at remote 0x7f0feab6f470>
      File "/tmp/hang_prog.py", line 5, in worker
        time.sleep(100)
      File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 982, in run
        self._target(*self._args, **self._kwargs)

    Thread 1 (Thread 0x7f0feb3e8b80 (LWP 6080) "python"):
    Traceback (most recent call first):
      File "/tmp/hang_prog.py", line 8, in train
        libc.sleep(1000)
      File "/tmp/hang_prog.py", line 9, in <module>
        train()
    #11 Frame 0x7f0feb3c3090, for file /tmp/hang_prog.py, line 8, in train ()
        libc.sleep(1000)
    #11 Frame 0x7f0feb3c3020, for file /tmp/hang_prog.py, line 9, in <module> ()
        train()
    [Inferior 1 (process 6080) detached]
    """)


def test_gdb_py_bt_gives_python_frames_where_the_interpreter_runs_them():
    main, worker = parse_dump(GDB_PY_BT)
    assert [(f.function, f.line) for f in main.frames] == [
        ("__GI___clock_nanosleep", 48), ("train", 8), ("<module>", 9), ("_PyEval_EvalFrameDefault", 4769),
        ("_start", 0)]  # py-bt-full's copy of the same frames is not read twice
    assert [f.native for f in main.frames] == [True, False, False, True, True]
    assert main.frames[1] == Frame("train", "/tmp/hang_prog.py", 8)
    assert [(f.function, f.file) for f in worker.frames[2:5]] == [
        ("sleep", "<built-in>"), ("worker", "/tmp/hang_prog.py"),
        ("run", "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py")]
    assert worker.frames[1].function == "cfunction_vectorcall_O"  # "<built-in method" in arguments is no frame


def test_gdb_bare_bt_and_py_bt_full_alone():
    bt = d("""
        [Current thread is 1 (Thread 0x7f2c1e9b0740 (LWP 31337))]
        (gdb) bt
        #0  0x00007f2c1e6a3117 in __futex_abstimed_wait_common () from /lib/x86_64-linux-gnu/libc.so.6
        #1  0x00007f2c1e6a8a41 in pthread_cond_wait@@GLIBC_2.3.2 () from /lib/x86_64-linux-gnu/libc.so.6
        #2  0x00007f2c0d3a1b22 in c10d::ProcessGroupNCCL::WorkNCCL::synchronizeInternal(std::chrono::duration<long, std::ratio<1l, 1000l> >) () from /w/venv/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so
        #3  0x00005605bd6e6f2f in _PyEval_EvalFrameDefault (tstate=<optimized out>, f=0x7f2c1e4b1a40, throwflag=<optimized out>) at Python/ceval.c:4231
        """)
    assert format_of(bt) == "gdb"
    (t,) = parse_dump(bt)
    assert (t.id, t.name, t.pid) == (31337, "", None)
    assert t.frames[2].function == ("c10d::ProcessGroupNCCL::WorkNCCL::synchronizeInternal"
                                    "(std::chrono::duration<long, std::ratio<1l, 1000l> >)")
    assert t.frames[3] == Frame("_PyEval_EvalFrameDefault", "Python/ceval.c", 4231)  # f=0x...: no Python frame
    # the header form of single-threaded targets: "process N"
    (p,) = parse_dump("Thread 1 (process 777):\n#0  main () at x.c:3\n")
    assert (p.id, p.frames) == (777, (Frame("main", "x.c", 3),))


def test_gdb_backtrace_pasted_from_its_middle():
    # the top frames cut off by whoever pasted it, gdb's wrapped "   from" lines kept
    text = d("""
        #8  0x00007f2b1c0d3e4f in cuMemcpyDtoHAsync_v2 () from /usr/lib/x86_64-linux-gnu/libcuda.so.1
        #9  0x00007f2b20a1b2c3 in ?? ()
           from /w/venv/lib/python3.8/site-packages/torch/lib/libcudart-a1b2c3d4.so.11.0
        #10 0x00007f2b20a4d5e6 in cudaMemcpyAsync ()
           from /w/venv/lib/python3.8/site-packages/torch/lib/libcudart-a1b2c3d4.so.11.0
        """)
    assert format_of(text) == "gdb"
    (t,) = parse_dump(text)
    assert [(f.function, f.base) for f in t.frames] == [
        ("cuMemcpyDtoHAsync_v2", "libcuda.so.1"), ("0x00007f2b20a1b2c3", "libcudart-a1b2c3d4.so.11.0"),
        ("cudaMemcpyAsync", "libcudart-a1b2c3d4.so.11.0")]
    # numbered lines that are not a backtrace: no address, or not one after the other
    assert format_of("#1 Fix the loader (urgent)\n#2 Add tests (later)\n") == ""
    assert format_of("#8  0x00007f2b1c0d3e4f in f () from /lib/a.so\nsee above\n#9  0x1 in g () from /lib/a.so\n") == ""


# --------------------------------------------------------------------------- pystack

# pystack 1.7.2 `remote PID --native` on the same program (trimmed)
PYSTACK_NATIVE = d("""
    Traceback for thread 6082 (python) [] (most recent call last):
        (C) File "./Modules/_threadmodule.c", line 1124, in thread_run (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)
        (Python) File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 982, in run
            self._target(*self._args, **self._kwargs)
        (Python) File "/tmp/hang_prog.py", line 5, in worker
            time.sleep(100)
        (C) File "./Modules/timemodule.c", line 383, in time_sleep (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)
        (C) File "./Modules/timemodule.c", line 2159, in pysleep (inlined) (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)

    Traceback for thread 6080 (python) [] (most recent call last):
        (C) File "???", line 0, in _start (/root/.pyenv/versions/3.11.7/bin/python3.11)
        (Python) File "/tmp/hang_prog.py", line 9, in <module>
            train()
        (Python) File "/tmp/hang_prog.py", line 8, in train
            libc.sleep(1000)
        (C) File "???", line 0, in ffi_call (/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2)
        (C) File "/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2", line 0, in ??? (/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2)
        (C) File "../sysdeps/posix/sleep.c", line 55, in sleep (/usr/lib/x86_64-linux-gnu/libc.so.6)

    """)


def test_pystack_native_reads_most_recent_call_last_in_reverse_main_thread_first():
    assert format_of(PYSTACK_NATIVE) == "pystack"
    main, worker = parse_dump(PYSTACK_NATIVE)  # pystack lists the newest thread first
    assert (main.id, main.name, main.state, main.gil) == (6080, "python", "", False)
    assert main.frames == (
        Frame("sleep", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0),
        Frame("0x?", "/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2", 0),
        Frame("ffi_call", "/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2", 0),
        Frame("train", "/tmp/hang_prog.py", 8),
        Frame("<module>", "/tmp/hang_prog.py", 9),
        Frame("_start", "/root/.pyenv/versions/3.11.7/bin/python3.11", 0),
    )
    assert [f.native for f in main.frames] == [True, True, True, False, False, True]
    assert not main.frames[1].named
    assert [f.function for f in worker.frames[:3]] == ["pysleep", "time_sleep", "worker"]  # "(inlined)" dropped


def test_pystack_gil_status_thread_names_with_parentheses_indentation_and_core_headers():
    # the status as pystack's PyThread.status prints it; threads indented two spaces as pystack prints them
    # with subinterpreters, a thread name cut inside its parentheses (shape of bloomberg/pystack#279)
    text = d("""
        Using executable found in the core file: /usr/bin/python3.10

        Core file information:
        state: t zombie: True niceness: 0
        pid: 9001 ppid: 1 sid: 1
        uid: 0 gid: 0 pgrp: 9001
        executable: python3.10 arguments: python train.py --rank 1

        The process died due receiving signal SIGABRT
        Interpreter-0 (main)
          Traceback for thread 9007 (Thread-1 (launc) [Waiting for the GIL] (most recent call last):
              (Python) File "/w/loader.py", line 12, in fetch
          Traceback for thread 9001 (pt_main_thread) [Has the GIL,Garbage collecting] (most recent call last):
              (Python) File "/w/train.py", line 88, in train
                  loss.item()
              (C) File "???", line 0, in cudaStreamSynchronize (/usr/local/cuda/lib64/libcudart.so.12)
              (C) File "???", line 0, in ??? (/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05)
        The frame stack for thread 9010 is empty
        """)
    assert format_of(text) == "pystack"
    main, *others = parse_dump(text)
    assert (main.id, main.name, main.state, main.gil, main.pid) == (9001, "pt_main_thread", "active", True, 9001)
    assert [(f.function, f.base) for f in main.frames] == [
        ("0x?", "libcuda.so.535.104.05"), ("cudaStreamSynchronize", "libcudart.so.12"), ("train", "train.py")]
    loader = next(t for t in others if t.id == 9007)
    assert (loader.name, loader.state, loader.gil) == ("Thread-1 (launc", "idle", False)
    assert next(t for t in others if t.id == 9010).frames == ()
    (one,) = split_processes(text)
    assert (one.pid, one.rank, one.label) == (9001, None, "pid 9001")  # "--rank 1" in its arguments is no label


# --------------------------------------------------------------------------- recognising dumps among logs

TRAINING_LOG = d("""
    [rank1]:[W1016 03:31:38.919469923 ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank 1]  using GPU 1
    epoch 0 step 100 loss 2.3125 lr 3.0e-4 (12.1 it/s)
    Thread 2 finished loading shard 7 (active workers: 3)
    Traceback (most recent call last):
      File "/w/train.py", line 140, in <module>
        main()
      File "/w/train.py", line 131, in main
        train_step(model, batch)
      File "/w/train.py", line 88, in train_step (epoch 3)
        loss.item()
    RuntimeError: CUDA error: an illegal memory access was encountered
    """)

NCCL_LOG = d("""
    node1:51234:51234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
    node1:51234:51234 [0] NCCL INFO NCCL version 2.18.5+cuda12.1
    node1:51234:51301 [0] NCCL INFO Channel 00/02 :    0   1
    node1:51234:51301 [0] NCCL INFO comm 0x55d3c0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE
    """)

# PyTorch's C++ traces in a watchdog timeout: "frame #N: ..." (shape of jpata/particleflow#390) and, with
# TORCH_SHOW_CPP_STACKTRACES, "C++ CapturedTraceback:" then "#N func from file:line" (torch/csrc/Module.cpp)
WATCHDOG_LOG = d("""
    [rank0]:[E1016 03:31:38.9 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout
    Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632 (most recent call first):
    frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f1a2b3c4d5e in /w/venv/lib/python3.10/site-packages/torch/lib/libc10.so)
    frame #1: <unknown function> + 0xd6df4 (0x7f1a3c4d5e6f in /usr/lib/x86_64-linux-gnu/libstdc++.so.6)
    C++ CapturedTraceback:
    #4 std::_Function_handler<std::shared_ptr<c10::LazyValue<std::string> const> (), c10::SetStackTraceFetcher(std::function<c10::LazyValue<std::string> ()>)::{lambda()#1}>::_M_invoke(std::_Any_data const&) from Logging.cpp:0
    #5 c10::Error::Error(c10::SourceLocation, std::string) from ??:0
    #6 c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) from ??:0
    """)


@pytest.mark.parametrize("text", [TRAINING_LOG, NCCL_LOG, WATCHDOG_LOG, "", "Error: Failed to find python version"])
def test_logs_are_not_dumps(text):
    assert format_of(text) == "" and parse_dump(text) == [] and split_processes(text) == []


def test_a_dump_inside_a_log_is_found_and_each_format_by_its_own_marks():
    assert format_of(TRAINING_LOG + "\n" + PYSPY_NATIVE) == "py-spy"
    assert format_of(WATCHDOG_LOG + GDB_FORMS) == "gdb"
    # the marks alone: a py-spy thread line needs its 4-space frames, a gdb header its "#N" frames
    assert format_of('Thread 51234 (idle): "MainThread"\n') == ""
    assert format_of('Thread 3 (Thread 0x7f6b2d7fe700 (LWP 12345) "python"):\nnothing\n') == ""
    assert format_of("Traceback for thread 12 [] (most recent call last):\n") == "pystack"
    assert format_of("\x1b[33mThread 7 (idle)\x1b[0m\n    \x1b[32mf\x1b[0m (x.py:1)\n") == "py-spy"  # colours


# --------------------------------------------------------------------------- faulthandler

CRASH = """
import ctypes, faulthandler, sys, threading, time

def next_batch():
    time.sleep(60)

def train_step():
    ctypes.string_at(0)  # a segfault, as a broken extension makes one

threading.Thread(target=next_batch, name="loader", daemon=True).start()
time.sleep(0.2)
print("step 41 loss 0.3", flush=True)
train_step()
"""


def test_a_rank_that_segfaults_under_faulthandler_leaves_a_dump_read_main_thread_first(tmp_path):
    """Python's own report of a fatal signal (``-X faulthandler``, as a rank prints it into its log), made here by
    a real process: found among the log's lines, every thread read, the main thread (the one running the script's
    module) first, innermost frame first, the line numbers kept."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(CRASH)
    p = subprocess.run([sys.executable, "-X", "faulthandler", str(script)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "Fatal Python error: Segmentation fault" in p.stderr
    log = p.stdout + p.stderr + "Extension modules: _ctypes (total: 1)\n"
    assert format_of(log) == "faulthandler"
    threads = parse_dump(log)
    assert len(threads) == 2
    main, loader = threads
    assert [f.function for f in main.frames] == ["string_at", "train_step", "<module>"]
    assert main.frames[1].file == str(script) and main.frames[1].line == 8 and not main.frames[1].native
    assert loader.frames[0].function == "next_batch" and loader.frames[0].line == 5
    assert main.state == "" and split_processes(log)[0].threads() == threads


def test_faulthandler_without_python_frames_or_cut_and_a_traceback_is_not_one():
    text = d("""
        Thread 0x00007f3c9a1fe640 (most recent call first):
          <no Python frame>

        Current thread 0x00007f3cb2e85740 (most recent call first):
          File "/w/train.py", line 88 in train_step
          File "/w/train.py", line 140 in <module>
        """)
    threads = parse_dump(text)
    assert [len(t.frames) for t in threads] == [2, 0]  # (the main thread first)
    assert threads[0].frames[0] == Frame("train_step", "/w/train.py", 88)
    # a Python traceback ("most recent call last", "line N, in f") is no dump
    assert format_of('Traceback (most recent call last):\n  File "/w/train.py", line 88, in train_step\n') == ""


# --------------------------------------------------------------------------- several processes


def _pyspy(pid: int, line: int) -> str:
    return d(f"""
        Process {pid}: /opt/venv/bin/python -u /w/train.py
        Python v3.10.12 (/usr/bin/python3.10)

        Thread {pid} (idle): "MainThread"
            train_step (/w/train.py:{line})
            <module> (/w/train.py:140)
        """)


def test_split_py_spy_dumps_with_rank_lines_of_every_form():
    labels = ["=== rank 0 ===", "[rank1]", "Rank 2:", "rank=3", "==> dumps/rank4.txt <==", "$ cat stacks_rank_5.txt"]
    text = "".join(f"{lab}\n{_pyspy(100 + r, 80 + r)}\n" for r, lab in enumerate(labels))
    parts = split_processes(text)
    assert [(p.rank, p.pid, p.label) for p in parts] == [(r, 100 + r, f"rank {r}") for r in range(6)]
    for r, p in enumerate(parts):
        (t,) = p.threads()
        assert t.pid == 100 + r and t.frames[0].line == 80 + r
        assert labels[r] not in p.text or r == 0  # a rank's line is not in the dump before it


def test_split_without_rank_lines_labels_by_pid_and_one_dump_is_one_item():
    parts = split_processes(_pyspy(11, 1) + _pyspy(12, 2))
    assert [(p.label, p.rank, p.pid) for p in parts] == [("pid 11", None, 11), ("pid 12", None, 12)]
    assert isinstance(parts[0], ProcessDump)
    (one,) = split_processes(PYSPY_NATIVE)
    assert (one.label, one.rank, one.pid, one.text) == ("pid 51234", None, 51234, PYSPY_NATIVE)
    (g,) = split_processes(GDB_FORMS)
    assert g.pid == 4242 and len(g.threads()) == 4
    # a local rank, a log line that mentions a rank, is no label
    for line in ("local_rank 0", "==> local_rank0.txt <==", "[rank0]:[E1016 03:31:38.9 ProcessGroupNCCL.cpp:632] x",
                 "ranks 0-3 wait in all_reduce", "rank 0 waits for rank 1"):
        (a,) = split_processes(line + "\n" + _pyspy(13, 3))
        assert a.rank is None, line
    (b,) = split_processes("x\n" + TRAINING_LOG + "== rank 5 ==\n" + _pyspy(13, 3))
    assert b.rank == 5


def test_split_dumps_without_process_headers_at_the_lines_naming_their_ranks():
    # pystack remote and gdb print no process header: the rank lines between the dumps split them
    text = ("rank 0 (pid 6080):\n" + PYSTACK_NATIVE + "\n\nrank 1 (pid 6090):\n"
            + PYSTACK_NATIVE.replace("6080", "6090").replace("6082", "6092"))
    parts = split_processes(text)
    assert [(p.rank, p.pid) for p in parts] == [(0, 6080), (1, 6090)]
    assert [p.threads()[0].id for p in parts] == [6080, 6090]
    bare = "## rank 2\n" + GDB_13 + "\n## rank 3\n" + GDB_13.replace("6080", "7080")
    parts = split_processes(bare)
    assert [(p.rank, p.pid, p.threads()[0].id) for p in parts] == [(2, 6080, 6080), (3, 7080, 7080)]
    # py-spy's JSON, one array per rank
    js = "[rank0]\n" + PYSPY_JSON + "\n[rank1]\n" + PYSPY_JSON.replace("6080", "6090")
    parts = split_processes(js)
    assert [(p.rank, p.pid, p.threads()[0].pid) for p in parts] == [(0, 6080, 6080), (1, 6090, 6090)]


def test_split_keeps_each_rank_with_its_own_dump_when_formats_mix():
    text = ("rank 0\n" + _pyspy(201, 88) + "\nrank 1\nAttaching to process 202\n" + GDB_13.replace("6080", "202")
            + "\nrank 2\n" + PYSTACK_NATIVE)
    parts = split_processes(text)
    assert [(p.rank, format_of(p.text)) for p in parts] == [(0, "py-spy"), (1, "gdb"), (2, "pystack")]
    assert [p.pid for p in parts] == [201, 202, None]
    assert parts[0].threads()[0].frames[0].line == 88 and parts[1].threads()[0].id == 202


def test_threads_and_frames_are_the_shared_types():
    (t,) = parse_dump(_pyspy(5, 7))
    assert isinstance(t, Thread) and t.to_dict()["frames"][0] == {"function": "train_step", "file": "/w/train.py",
                                                                  "line": 7}
