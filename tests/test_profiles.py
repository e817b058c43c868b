import json
import os

import pytest

from conftest import EXAMPLE, ROOT, json_events, only_run, run_ddptop
from ddptop.core.run.launcher import plan_launch
from ddptop.core.run.profiles import BUILTIN, ProfileError, load_all, load_file, resolve, rewrite_script_args

NCCL_SCRIPT = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('nccl')\n"
    "t = torch.ones(1) * (dist.get_rank() + 1)\n"
    "dist.all_reduce(t)\n"
    "print(f'rank {dist.get_rank()} sum {t.item():g} backend {dist.get_backend()}')\n"
    "dist.destroy_process_group()\n"
)


def test_builtins_are_all_there():
    assert {p.name for p in BUILTIN} >= {"default", "p2p-off", "shm-off", "ib-off", "nccl-debug", "flight-recorder",
                                         "fail-fast", "gloo", "single-gpu", "fewer-workers"}


@pytest.mark.parametrize("text,line,words", [
    ('[profiles.x]\ndescription = "a"\nenv = { A = "1" \n', 3, "invalid TOML"),
    ('[profiles.x]\ndescription = "a"\nenvv = { A = "1" }\n', 3, "unknown key 'envv'"),
    ('[profiles.x]\ndescription = "a"\n\n[profiles.y]\ndescription = "b"\nunset = "NCCL_DEBUG"\n', 6, "profiles.y.unset: expected list"),
    ('[profiles.x]\nenv = { A = "1" }\n', 1, "missing key 'description'"),
    ('[profiles.x]\ndescription = "a"\nbackend = "nccl2"\n', 3, "not a process-group backend"),
    ('[profiles.x]\ndescription = "a"\nenv = { A = [1] }\n', 3, "profiles.x.env.A"),
])
def test_bad_profile_files_name_file_line_and_key(tmp_path, text, line, words):
    f = tmp_path / "ddptop.toml"
    f.write_text(text)
    with pytest.raises(ProfileError) as e:
        load_file(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:{line}:"), msg
    assert words in msg


def test_user_files_add_and_override(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[profiles.p2p-off]\ndescription = "ours"\nenv = { NCCL_P2P_LEVEL = "NVL" }\n'
                 '[profiles.mine]\ndescription = "mine"\nscript_args = { "--num_workers" = "half" }\n')
    allp = load_all([f])
    assert allp["p2p-off"].env == {"NCCL_P2P_LEVEL": "NVL"} and allp["p2p-off"].source == str(f)
    assert "mine" in allp and "gloo" in allp
    with pytest.raises(ProfileError, match="unknown profile 'nope'"):
        resolve(["nope"], [f])


def test_profiles_change_the_launch_in_order(tmp_path):
    user = ["torchrun", "--nproc_per_node=4", "--nnodes", "1", EXAMPLE, "--num_workers", "8", "--lr=3"]
    plan = plan_launch(user, tmp_path, profiles=resolve(["p2p-off", "single-gpu", "fewer-workers", "nccl-debug"], []))
    assert plan.env_set["NCCL_P2P_DISABLE"] == "1" and plan.env_set["NCCL_DEBUG"] == "INFO"
    assert "--nproc_per_node=1" in plan.command and plan.command[plan.command.index("--nnodes") + 1] == "1"
    assert plan.command[-3:] == ["--num_workers", "4", "--lr=3"]
    assert rewrite_script_args(["--workers=7"], {"--workers": "half"}) == ["--workers=3"]


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


def test_secret_names_by_segment_and_secret_option_values_masked():
    from ddptop.core.run.profiles import is_secret, mask_argv

    for name in ("HF_TOKEN", "hfToken", "API_KEY", "APIKEY", "DB_PASSWD", "AWS_SECRET_ACCESS_KEY",
                 "GOOGLE_CREDENTIALS", "BASIC_AUTH", "WANDB_API_KEY", "hf-token", "api-key", "HUGGING_FACE_HUB_TOKEN"):
        assert is_secret(name), name
    for name in ("AUTHOR", "KEYBOARD", "PWD", "MASTER_PORT", "NCCL_IB_HCA", "TOKENIZERS_PARALLELISM", "lr",
                 "pad-token", "eos_token", "max-tokens", "max_token_len", "num-key-heads", "token-type-ids"):
        assert not is_secret(name), name
    assert mask_argv(["torchrun", "t.py", "--hf-token", "abc", "--api-key=xyz", "--lr", "0.1", "--token"]) == [
        "torchrun", "t.py", "--hf-token", "***", "--api-key=***", "--lr", "0.1", "--token"]
    assert mask_argv(["t.py", "--password", "--verbose"]) == ["t.py", "--password", "--verbose"]  # a flag, no value
