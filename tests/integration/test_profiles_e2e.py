"""Launch profiles on real launches: secrets never journalled in clear, the gloo profile, `ddptop profiles`.

(The pure parts: tests/unit/test_profiles.py.)"""

import json
import os

from conftest import EXAMPLE, ROOT, json_events, only_run, run_ddptop

NCCL_SCRIPT = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('nccl')\n"
    "t = torch.ones(1) * (dist.get_rank() + 1)\n"
    "dist.all_reduce(t)\n"
    "print(f'rank {dist.get_rank()} sum {t.item():g} backend {dist.get_backend()}')\n"
    "dist.destroy_process_group()\n"
)


def test_secrets_are_never_journalled_in_clear(tmp_path, runs_dir, monkeypatch):
    cfg = tmp_path / "cfg"
    (cfg / "ddptop").mkdir(parents=True)
    (cfg / "ddptop" / "profiles.toml").write_text(
        '[profiles.wandb]\ndescription = "log to wandb"\nenv = { WANDB_API_KEY = "s3cr3t-value", MY_FLAG = "1" }\n')
    script = tmp_path / "show.py"
    script.write_text("import os\nprint('key is set:', os.environ.get('WANDB_API_KEY') == 's3cr3t-value', os.environ.get('MY_FLAG'))\n")
    env = dict(os.environ, XDG_CONFIG_HOME=str(cfg))
    r = run_ddptop("--json", "--profile", "wandb", "torchrun", "--nproc-per-node", "1", str(script), env=env)
    assert r.returncode == 0, r.stderr
    assert any(e["kind"] == "log" and e["text"] == "key is set: True 1" for e in json_events(r.stdout))
    run = only_run(runs_dir)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["env_set"]["WANDB_API_KEY"] == "***" and meta["env_set"]["MY_FLAG"] == "1"
    for f in run.rglob("*"):
        if f.is_file():
            assert b"s3cr3t-value" not in f.read_bytes(), f
    listing = run_ddptop("profiles", "--json", env=env)
    assert "s3cr3t-value" not in listing.stdout and '"WANDB_API_KEY": "***"' in listing.stdout


def test_gloo_profile_runs_a_script_that_hard_codes_nccl_on_cpu(tmp_path, runs_dir):
    script = tmp_path / "nccl_train.py"
    script.write_text(NCCL_SCRIPT)
    plain = run_ddptop("--json", "torchrun", "--nproc-per-node", "2", str(script))
    assert plain.returncode != 0
    assert any(e["kind"] == "alarm" and "gloo" in e["suggested_profiles"] for e in json_events(plain.stdout))
    r = run_ddptop("--json", "--profile", "gloo", "torchrun", "--nproc-per-node", "2", str(script))
    assert r.returncode == 0, r.stdout[-3000:]
    events = json_events(r.stdout)
    texts = {e["text"] for e in events if e["kind"] == "log" and e["rank"] is not None}
    assert {"rank 0 sum 3 backend gloo", "rank 1 sum 3 backend gloo"} <= texts
    notes = [e["message"] for e in events if e["kind"] == "note"]
    assert any("init_process_group backend 'nccl' -> 'gloo'" in n for n in notes)  # said in the journal


ONE_RANK_ERRORS = """\
import sys
print("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.21.5", flush=True)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
sys.exit(1)
"""


def test_a_one_rank_jobs_alarms_suggest_nothing_its_shape_leaves_unchanged(tmp_path, runs_dir):
    """One rank on one node: no peer-to-peer or shared memory between its GPUs to turn off, no fewer processes to
    run it on.  The live alarms and the post-mortem say the same."""
    script = tmp_path / "fails.py"
    script.write_text(ONE_RANK_ERRORS)
    r = run_ddptop("--json", "torchrun", "--nproc-per-node", "1", str(script))
    assert r.returncode == 1, r.stderr[-2000:]
    alarms = {e["id"]: e["suggested_profiles"] for e in json_events(r.stdout) if e["kind"] == "alarm"}
    assert alarms.get("nccl-system-error") == ["nccl-debug"], alarms  # (shm-off and p2p-off taken out)
    assert alarms.get("cuda-oom") == [], alarms  # (single-gpu taken out)
    rep = json.loads(run_ddptop("diagnose", "--json", str(only_run(runs_dir))).stdout)
    assert not {"p2p-off", "shm-off", "single-gpu"} & set(rep["root_cause"]["suggested_profiles"]), rep["root_cause"]


def test_a_shape_told_by_torchruns_own_variables_is_journalled_for_the_post_mortem(tmp_path, runs_dir):
    """A job whose shape only torchrun's PET_* variables give (a Kubeflow PyTorchJob's pod, a script that
    exports them): the journal records them, and the post-mortem suggests what the live alarm did (two
    ranks on a node: their transports can be turned off)."""
    script = tmp_path / "fails.py"
    script.write_text(ONE_RANK_ERRORS)
    r = run_ddptop("--json", "torchrun", str(script), env=dict(os.environ, PET_NPROC_PER_NODE="2"))
    assert r.returncode == 1, r.stderr[-2000:]
    events = json_events(r.stdout)
    alarms = {e["id"]: e["suggested_profiles"] for e in events if e["kind"] == "alarm"}
    assert "p2p-off" in alarms.get("nccl-system-error", []) and alarms.get("cuda-oom") == ["single-gpu"], alarms
    meta = json.loads((only_run(runs_dir) / "meta.json").read_text())
    assert meta["nproc_per_node"] == 2 and meta["torchrun_env"]["PET_NPROC_PER_NODE"] == "2", meta
    rep = json.loads(run_ddptop("diagnose", "--json", str(only_run(runs_dir))).stdout)
    root = rep["root_cause"]
    assert root["suggested_profiles"] == alarms[root["signature"]], (root, alarms)


def test_profiles_command_lists_and_bad_file_is_a_clear_error(tmp_path):
    r = run_ddptop("profiles")
    assert r.returncode == 0 and "p2p-off" in r.stdout and "NCCL_P2P_DISABLE=1" in r.stdout
    (tmp_path / "ddptop.toml").write_text('[profiles.x]\ndescription = 3\n')
    import subprocess, sys
    r = subprocess.run([sys.executable, "-m", "ddptop", "--profile", "x", "torchrun", "--nproc-per-node", "1", EXAMPLE],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2
    assert f"{tmp_path / 'ddptop.toml'}:2: profiles.x.description: expected str" in r.stderr
