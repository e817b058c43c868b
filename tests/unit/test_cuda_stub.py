"""The CUDA runtime stand-in (examples/cuda_stub, examples/sim_cuda.py), the parts that need no C
compiler: no compiler is a reason, not an error; the example's options for it.  (The library built and
run, and the example under torchrun: tests/integration/test_cuda_stub_e2e.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXAMPLE = EXAMPLES / "train_ddp.py"
_spec = importlib.util.spec_from_file_location("sim_cuda", EXAMPLES / "sim_cuda.py")
sim_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim_cuda)


def test_no_compiler_is_a_reason_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sim_cuda, "compiler", lambda: None)
    cudart, why = sim_cuda.load()
    assert cudart is None and "no C compiler" in why


def test_the_example_options_for_the_cuda_stand_in(capsys):
    spec = importlib.util.spec_from_file_location("train_ddp", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.parse_args(["--sim-cuda", "on"])
    assert args.sim_cuda_sync == "spin" and args.fault == "none"  # the defaults
    args = example.parse_args(["--sim-cuda", "auto", "--sim-cuda-sync", "blocking", "--fault", "driver-lock"])
    assert args.sim_cuda_sync == "blocking" and args.fault == "driver-lock"
    for argv, why in ((["--sim-cuda-sync", "blocking"], "--sim-cuda-sync needs --sim-cuda"),
                      (["--fault", "driver-lock"], "--fault driver-lock needs --sim-cuda")):
        with pytest.raises(SystemExit) as e:
            example.parse_args(argv)
        assert e.value.code == 2 and why in capsys.readouterr().err
