"""The scenario matrix's pieces (bench/matrix), without Ray: cells, jobs, verdicts, the training job.

The matrix itself (`python -m bench.matrix`) is a benchmark-style run through the real
runtime; these tests keep its definitions honest at `make test` cost.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.matrix.cells import FAULTS, RUNTIME, Cell, cells
from bench.matrix.run import Result, judge, table


def test_every_cell_is_a_valid_job_under_the_default_policy(tmp_path: Path) -> None:
    selected = cells()
    assert len(selected) == 3 * 2 * 6 * 2
    assert len({c.name for c in selected}) == len(selected)
    for c in selected:
        job = c.job(tmp_path / c.name)
        assert job.policy == "default" and job.resources.num_workers == 2
    persistent = Cell("gru", "sgd", "lr_persistent", "idle").job(tmp_path)
    assert persistent.config["lr_bug"] == {"step": 90, "factor": 30} and not persistent.faults
    # The job's runtime knobs reach the supervisor as `supervisor launch` passes them.
    from supervisor.config.runtime import settings_for

    assert settings_for(persistent).loop_interval_s == RUNTIME["loop_interval_s"]
    assert [f.kind for f in Cell("encoder", "adamw", "garbage_rank", "busy").job(tmp_path).faults] == [
        "garbage_batch"
    ]
    bad = Cell("gru", "sgd", "bad_source", "idle").job(tmp_path)
    assert bad.config["bad_source"] == {"source": "web", "step": 90} and not bad.faults


def test_subsets_keep_their_clean_reference_first() -> None:
    picked = cells(("convnet",), ("sgd",), ("nan_step",), ("idle",))
    assert [c.fault for c in picked] == ["clean", "nan_step"]


def _result(fault: str, phase: str, loss: float | None, ref: float | None, **kw: object) -> Result:
    r = Result(f"gru-adamw-{fault}-idle", "gru", "adamw", fault, "idle", phase=phase, final_loss=loss)
    r.reference_loss = ref
    for k, v in kw.items():
        setattr(r, k, v)
    judge(r)
    return r


def test_verdicts_follow_the_matrix_criteria() -> None:
    assert _result("lr_cured", "finished", 2.04, 2.0).ok  # within 5%
    assert not _result("lr_cured", "finished", 2.2, 2.0).ok
    assert not _result("garbage_rank", "escalated", 2.0, 2.0, reason="replay failed").ok
    serious = [{"severity": "medium", "rules": ["transient"]}]
    assert not _result("clean", "finished", 2.0, 2.0, incidents=serious).ok
    assert _result("clean", "finished", 2.0, 2.0, incidents=[{"severity": "low", "rules": []}]).ok
    why = [{"severity": "high", "rules": ["optimizer_state", "optimizer_state"], "escalation": "recurrence"}]
    esc = _result("lr_persistent", "escalated", None, 2.0, incidents=why)
    assert esc.ok and "after 2 plan(s): recurrence" in esc.verdict
    assert not _result("lr_persistent", "finished", 2.0, 2.0).ok
    assert "**no**" in table([_result("nan_step", "failed", None, 2.0, reason="x")])


def test_a_bad_source_passes_only_when_the_supervisor_kept_it_out() -> None:
    """Finishing near the clean loss is not enough: the cell must show the source (or its samples) excluded."""
    assert not _result("bad_source", "finished", 2.0, 2.0).ok
    seen = [
        {"severity": "medium", "rules": ["source_local"], "excluded_sources": ["web"], "excluded_samples": 3}
    ]
    ok = _result("bad_source", "finished", 2.0, 2.0, incidents=seen)
    assert ok.ok and "source `web` excluded" in ok.verdict
    assert not _result("bad_source", "finished", 2.3, 2.0, incidents=seen).ok
    assert _result("bad_source", "finished", 1.8, 2.0, incidents=seen).ok  # the other sources got its steps


def test_the_bad_source_is_garbage_from_its_step_in_every_reading() -> None:
    import torch

    from bench.matrix.data import build as build_data
    from bench.matrix.job import ReplayHooks, bad_source

    cfg = {"bad_source": {"source": "web", "step": 80}}
    batch = {"input_ids": torch.arange(12).reshape(3, 4), "targets": torch.arange(12).reshape(3, 4),
             "sample_ids": ["code:a:0", "web:b:0", "web:c:32"], "sources": ["code", "web", "web"]}  # fmt: skip
    assert bad_source(cfg, 79, batch) is batch
    bad = bad_source(cfg, 80, batch)
    assert torch.equal(bad["input_ids"][0], batch["input_ids"][0])
    assert not torch.equal(bad["input_ids"][1:], batch["input_ids"][1:])
    assert torch.equal(bad_source(cfg, 150, batch)["input_ids"], bad["input_ids"])  # the same garbage again
    # A replay rebuilds the batch from sample IDs and meets the same bad source.
    ds = build_data("synthetic", 16, 8192, 0, "web")
    web = next(ds.sample_id(i) for i in range(len(ds)) if ds.source(i) == "web")
    other = next(ds.sample_id(i) for i in range(len(ds)) if ds.source(i) != "web")
    hooks = ReplayHooks(model=torch.nn.Linear(1, 1), optimizer=None, dataset=ds, config=cfg)  # type: ignore[arg-type]
    clean = ReplayHooks(model=torch.nn.Linear(1, 1), optimizer=None, dataset=ds, config={})  # type: ignore[arg-type]
    replayed, clean = hooks.batch([web, other]), clean.batch([web, other])
    assert torch.equal(replayed["input_ids"][1], clean["input_ids"][1])
    assert not torch.equal(replayed["input_ids"][0], clean["input_ids"][0])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gru", "encoder", "convnet"])
def test_the_job_trains_offline_and_lowers_the_loss(tmp_path: Path, family: str) -> None:
    from bench.matrix.job import main

    trace = tmp_path / "t.jsonl"
    cfg = {"family": family, "data": "synthetic", "d_model": 16, "seq_len": 16, "bytes_per_source": 8192,
           "extra_source": "web", "max_steps": 30, "lr_bug": {"step": 25, "factor": 30}, "trace": str(trace)}  # fmt: skip
    import bench.matrix.job as job

    real_init = job.sdk.init
    job.sdk.init = lambda *a, **k: real_init(*a, **k, trace=str(trace))  # type: ignore[assignment]
    try:
        assert main(cfg)["steps"] == 30
    finally:
        job.sdk.init = real_init  # type: ignore[assignment]
    recs = [json.loads(line) for line in trace.read_text().splitlines()]
    losses = [r["loss"] for r in recs if "loss" in r]
    lrs = {r["step"]: r["lr"] for r in recs if "lr" in r}
    assert sum(losses[-5:]) < sum(losses[:5])
    assert lrs[26] > 10 * lrs[24]  # the persistent LR bug is in the job's own schedule
    assert FAULTS["lr_persistent"].escalates
