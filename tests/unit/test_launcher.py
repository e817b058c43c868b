"""How ddptop plans a torchrun launch: arguments passed through, the options ddptop owns, torchrun's
flag list.

(Launches that fail before anything starts: tests/integration/test_launcher_e2e.py.)"""

from pathlib import Path

from conftest import EXAMPLE
from ddptop.core.run.launcher import parse_torchrun_args, plan_launch
from ddptop.core.sources.proc_torchrun import TORCHRUN_FLAGS


def test_torchrun_args_pass_through_unchanged(tmp_path):
    user = ["torchrun", "--nnodes=1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint=localhost:0", "--max-restarts", "3", "--standalone",
            EXAMPLE, "--steps", "5", "--json"]
    plan = plan_launch(user, tmp_path)
    assert Path(plan.command[0]).name == "torchrun"
    # ddptop's additions come first, then the person's words, in order
    assert plan.command[1:5] == ["--log-dir", str(tmp_path / "logs"), "--redirects", "3"]
    assert plan.command[5:] == user[1:]
    assert plan.nproc_per_node == 2 and plan.node_rank == 0
    assert plan.env_set.get("PYTHONUNBUFFERED") in ("1", None)


def test_the_jobs_shape_comes_from_its_options_else_torchruns_own_variables(tmp_path, monkeypatch):
    """A pod of a Kubeflow PyTorchJob gets its shape as PET_* variables, no options: node 1 of 2, 4 a node."""
    for k in [k for k in __import__("os").environ if k.startswith("PET_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_NODE_RANK", "1")
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    plan = plan_launch(["torchrun", EXAMPLE], tmp_path)
    assert (plan.nproc_per_node, plan.node_rank) == (4, 1)
    plan = plan_launch(["torchrun", "--nproc-per-node", "2", "--node-rank", "0", EXAMPLE], tmp_path)
    assert (plan.nproc_per_node, plan.node_rank) == (2, 0)  # (the command's own options first)
    monkeypatch.delenv("PET_NODE_RANK")
    assert plan_launch(["torchrun", EXAMPLE], tmp_path).node_rank is None  # (2 nodes, which one not said)


def test_owned_options_are_replaced_with_a_note(tmp_path):
    plan = plan_launch(["torchrun", "--tee", "3", "--log_dir=/elsewhere", EXAMPLE], tmp_path)
    assert "/elsewhere" not in plan.command and "--tee" not in plan.command
    assert plan.notes and "--tee 3" in plan.notes[0]


def test_script_arguments_that_look_like_options_stay_with_the_script(tmp_path):
    a = parse_torchrun_args(["--nproc_per_node=2", "-m", "pkg.train", "--nproc-per-node", "9"])
    assert a.script == "pkg.train" and a.script_args == ["--nproc-per-node", "9"]
    assert a.values["--nproc-per-node"] == "2"


def test_flag_list_matches_torchrun():
    """Every store_true option of torch's own torchrun parser is known as a flag."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    for action in parser._actions:
        if action.nargs == 0:
            for opt in action.option_strings:
                assert opt in TORCHRUN_FLAGS, f"{opt} takes no value but ddptop would eat the next word"
