"""What docs/integrations.md says about the sdk.watch style, checked against what the code does."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from examples.tinylm.data import build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig
from supervisor import sdk
from supervisor.config.job import JobSpec
from supervisor.sdk.context import trace_path

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()


def test_the_plain_torchrun_trace_is_named_as_the_docs_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs named ``torchrun_trace.rank<N>.jsonl``; a script without ``trace=`` writes the SDK's default."""
    from examples.torchrun import train

    said = re.search(r"each rank writes `([\w.]+)\.rank<N>\.jsonl`", DOCS)
    assert said is not None
    assert trace_path(None, 1, 2).name == f"{said.group(1)}.rank1.jsonl"
    # The example, run as written (no --trace) in one process, writes that file.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SUPERVISOR_TRACE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    argv = [
        "train",
        "--steps",
        "2",
        "--d-model",
        "16",
        "--layers",
        "1",
        "--seq-len",
        "16",
        "--data-bytes",
        "3000",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    train.main()
    assert [p.name for p in tmp_path.glob("*.jsonl")] == [f"{said.group(1)}.jsonl"]


def ctx(max_steps: int) -> Any:
    job = JobSpec.model_validate(
        {"name": "j", "entrypoint": "python -m x", "max_steps": max_steps, "storage": {"path": "/tmp/unused"}}
    )
    return SimpleNamespace(rank=0, world_size=1, transport=sdk.MemoryTransport(flush_interval_s=0.01),
                           checkpoint_store=None, resume_step=None, job=job)  # fmt: skip


def test_max_steps_of_the_call_wins_over_the_jobs_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    model = TinyLM(TinyLMConfig(seq_len=16, d_model=16, n_layers=1, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    assert "max_steps=` given to `sdk.init` /\n`sdk.watch` (or a framework callback) **wins**" in DOCS
    with caplog.at_level("WARNING"):
        probe = sdk.watch(model, opt, ctx=ctx(300), max_steps=200)
    assert probe.settings.max_steps == 200
    assert "max_steps_differs" in caplog.text and "300" in caplog.text, caplog.text
    probe.close()
    caplog.clear()
    with caplog.at_level("WARNING"):
        probe = sdk.watch(model, opt, ctx=ctx(300))
    assert probe.settings.max_steps == 300 and "max_steps_differs" not in caplog.text
    probe.close()


def test_the_keys_the_loader_adds_are_the_documented_ones() -> None:
    loader = sdk.SupervisedLoader(build_dataset(16, 3_000, 0), 2, seed=0, collate_fn=collate)
    batch = loader.next_batch()
    added = set(batch) - set(collate([build_dataset(16, 3_000, 0)[0]]))
    assert added == set(sdk.META_KEYS) == {"sample_ids", "sources", "batch_index"}
    for key in sdk.META_KEYS:
        assert f"`{key}`" in DOCS
    loader.close()


def test_the_torchrun_example_with_the_supervised_loader_names_samples_and_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from examples.torchrun import train

    monkeypatch.setenv("WORLD_SIZE", "1")
    trace = tmp_path / "trace.jsonl"
    argv = ["train", "--steps", "3", "--d-model", "16", "--layers", "1", "--seq-len", "16", "--data-bytes", "3000",
            "--batch-size", "4", "--supervised-loader", "--trace", str(trace)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    train.main()
    recs = [json.loads(line) for line in trace.read_text().splitlines()]
    recs = [r for r in recs if "loss" in r and not r.get("control")]
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert len(r["samples"]) == 4 and r["attrs"]["batch"] == r["step"] - 1
        assert sum(s["tokens"] for s in r["sources"].values()) == r["tokens"]
        assert sum(s["loss_sum"] for s in r["sources"].values()) == pytest.approx(r["loss_sum"], rel=1e-9)
