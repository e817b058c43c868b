"""Launch profiles: the built-in ones, profile files, what a profile changes in a launch, secrets masked.

(Real launches with profiles: tests/integration/test_profiles_e2e.py.)"""

import pytest

from conftest import EXAMPLE
from ddptop.core.run.launcher import plan_launch
from ddptop.core.run.profiles import BUILTIN, ProfileError, load_all, load_file, resolve, rewrite_script_args


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
    # eager-load: every kernel loaded when CUDA starts (what the H100 run showed moves a launch's wait)
    plan = plan_launch(user, tmp_path, profiles=resolve(["eager-load"], []))
    assert plan.env_set["CUDA_MODULE_LOADING"] == "EAGER" and plan.command[-4:] == user[-4:]


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


def test_profiles_the_job_already_runs_with_are_in_effect():
    from ddptop.core.run.profiles import in_effect

    known = load_all([])
    env = {"NCCL_P2P_DISABLE": "1", "CUDA_MODULE_LOADING": "EAGER", "NCCL_IB_DISABLE": "0"}
    got = in_effect(known, env)
    assert {"p2p-off", "eager-load"} <= got
    assert "ib-off" not in got  # its variable has another value
    assert "gloo" not in got and "nccl-debug" not in got  # a backend; one of several variables missing
    assert in_effect(known, {}) == set()


def test_profiles_the_jobs_shape_leaves_nothing_to_change_are_in_effect():
    """No peer-to-peer or shared memory between the GPUs of a node that runs one rank; no fewer processes for a
    job of one."""
    from ddptop.core.run.profiles import Profile, in_effect
    from ddptop.core.sources.proc_torchrun import TorchrunOptions as T

    known = load_all([])
    one = in_effect(known, {}, torchrun=T(nproc_per_node="1"))  # (torchrun's default --nnodes: 1)
    assert {"p2p-off", "shm-off", "single-gpu"} <= one, one
    assert not {"nccl-debug", "gloo", "ib-off", "eager-load", "flight-recorder"} & one, one
    # one rank a node on two nodes: nothing between one node's GPUs, but two processes
    two_nodes = in_effect(known, {}, torchrun=T(nnodes="2", nproc_per_node="1"))
    assert {"p2p-off", "shm-off"} <= two_nodes and "single-gpu" not in two_nodes, two_nodes
    # two ranks a node, or a count torchrun works out itself: each of them may change something
    assert in_effect(known, {}, torchrun=T(nproc_per_node="2")) == set()
    assert in_effect(known, {}, torchrun=T(nproc_per_node="gpu")) == set()
    # without the job's shape, only its environment says (as before)
    assert in_effect(known, {}) == set()
    # a profile of the person's own that sets more than one node's transports still changes something
    mine = {**known, "p2p-debug": Profile("p2p-debug", "p2p off, NCCL's debug on",
                                          env={"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO"})}
    assert "p2p-debug" not in in_effect(mine, {}, torchrun=T(nproc_per_node="1"))
    assert "p2p-debug" in in_effect(mine, {"NCCL_DEBUG": "INFO"}, torchrun=T(nproc_per_node="1"))


def test_a_launch_commands_shape_is_read_from_its_options_else_torchruns_own_variables():
    from ddptop.core.run.launcher import launch_options

    def shape(command, env):
        o = launch_options(command, env)
        return None if o is None else {k: v for k, v in (("--nnodes", o.nnodes), ("--nproc-per-node", o.nproc_per_node))
                                       if v is not None}

    cmd = ["torchrun", "--log-dir", "/x", "--nproc_per_node=1", "train.py", "--nproc-per-node", "8"]
    assert shape(cmd, {}) == {"--nproc-per-node": "1"}  # (the script's own options are its own)
    assert shape(["torchrun", "train.py"], {"PET_NPROC_PER_NODE": "8", "PET_NNODES": "2"}) == {
        "--nnodes": "2", "--nproc-per-node": "8"}
    assert shape(["torchrun", "--nnodes", "4", "train.py"], {"PET_NNODES": "2"}) == {"--nnodes": "4"}
    assert shape(["torchrun"], {}) is None  # (no script: not a command it can read)


def test_an_alarm_never_suggests_a_profile_in_effect():
    from ddptop.core.model.events import AlarmEvent, LogBatch
    from ddptop.core.run.pipeline import Pipeline

    now = [100.0]
    p = Pipeline(clock=lambda: now[0], in_effect=lambda: {"nccl-debug"})
    # a rank's segfault: a crash alarm whose suggestions include nccl-debug, taken out here
    out = p.process([LogBatch(100.0, rank=1, path="logs/1", texts=(
        "Fatal Python error: Segmentation fault",))], check=True)
    crash = [a for a in out if isinstance(a, AlarmEvent)]
    assert crash and all("nccl-debug" not in a.suggested_profiles and "gloo" in a.suggested_profiles
                         for a in crash), crash
    plain = Pipeline(clock=lambda: now[0]).process([LogBatch(100.0, rank=1, path="logs/1", texts=(
        "Fatal Python error: Segmentation fault",))], check=True)
    assert any("nccl-debug" in a.suggested_profiles for a in plain if isinstance(a, AlarmEvent)), plain
