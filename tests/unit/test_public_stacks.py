"""The stack verdict on real dumps people posted in public threads (tests/data/stacks/public/).

Each case is a folder with the dumps as posted (py-spy text, gdb's ``thread apply
all bt``, one file per rank) and ``case.json``: its source thread
(``owner/repo#N``) and the truth the thread establishes (each rank's kind, the
culprits, whether every rank sat on the CUDA driver's lock).  The cases are read
the way ``ddptop diagnose FOLDER`` reads them (``dump_files.load``): one sample a
rank, so ``hung`` is never claimed, and only what the thread supports is checked.
A second set, kept aside and scored only at the end, is in
tests/data/heldout/stacks (``python tests/bench/stacks_heldout.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddptop.core.sources import stack_files as dump_files
from ddptop.core.analysis.stack_verdict import verdict
from ddptop.core.tools.diagnose import StacksReport

PUBLIC = Path(__file__).resolve().parents[1] / "data" / "stacks" / "public"
CASES = sorted(d.name for d in PUBLIC.iterdir() if (d / "case.json").is_file())


def load(case: str):
    d = PUBLIC / case
    meta = json.loads((d / "case.json").read_text())
    # (a "fragment" file is a second, non-contiguous excerpt of the same post: never a rank of its own, unless
    # the case says its truth is about the thread in it: "files")
    files = [str(d / f) for f in meta["files"]] if "files" in meta else \
        [str(f) for f in sorted(d.iterdir()) if f.name != "case.json" and "fragment" not in f.name]
    ds = dump_files.load(files)
    assert ds is not None, f"{case}: no dump recognised in {files}"
    return ds, meta


@pytest.mark.parametrize("case", CASES)
def test_public_dump_reads_as_its_thread_says(case):
    ds, meta = load(case)
    truth = meta["truth"]
    v = verdict(ds.samples)
    got = {str(r): w.kind for r, w in v.where.items()}
    for rank, kind in truth.get("ranks", {}).items():
        assert got.get(rank) == kind, f"{case} ({meta['source']}): rank {rank} read as {got.get(rank)}, " \
                                      f"the thread says {kind}: {v.summary}"
    if len(ds.samples) > 1:
        assert sorted(v.culprits) == sorted(truth.get("culprits", [])), f"{case}: {v.summary}"
    if len(ds.samples) == 1 and min(len(x) for x in ds.samples.values()) == 1:
        assert v.hung is None  # one sample: frozen and moving cannot be told apart
    # never an address in the words a person reads
    words = " ".join([v.summary] + [w.text for w in v.where.values()] + [g.text for g in v.groups])
    assert "0x7f" not in words and "0x00" not in words, words
    # the text report renders without error and says the kind in words
    text = "\n".join(StacksReport(v, ds).lines())
    assert text.startswith("Stacks:"), text


def test_the_public_set_covers_the_kinds_real_gpu_stacks_have():
    kinds = {k for case in CASES for k in json.loads((PUBLIC / case / "case.json").read_text())["truth"]
             .get("ranks", {}).values()}
    assert {"gpu-wait", "gpu-lock", "nccl", "backward"} <= kinds
