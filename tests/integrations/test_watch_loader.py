"""sdk.watch with the SupervisedLoader: records name their samples and sources, exclusions work,
per-sample sums give per-source losses, and bad arguments are refused in one line naming them.

The user's loop keeps its own backward, clip and optimizer step (a torchrun-style script); one
process, no Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from examples.tinylm.data import build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig
from supervisor import sdk
from supervisor.checkpoint.store import CheckpointStore
from supervisor.errors import SupervisorError
from supervisor.sdk.directives import ApplyOverrides, Exclusions, RollbackInPlace
from supervisor.storage import open_backend

BATCH = 4


def setup(max_steps: int, store: Any = None, **settings: Any) -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=16, d_model=16, n_layers=1, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = sdk.SupervisedLoader(build_dataset(16, 3_000, 0), BATCH, seed=0, collate_fn=collate)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.watch(model, opt, loader=loader, transport=transport, checkpoint=store, max_steps=max_steps,
                      **settings)  # fmt: skip
    return model, opt, loader, probe, transport


def per_sample(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The user's loss as per-sample token sums (what ``sdk.token_losses`` returns, written out)."""
    logits = model(batch["input_ids"])
    targets = batch["targets"]
    token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none")
    mask = targets != -100
    return (token.view(targets.shape) * mask).sum(1), mask.sum(1)


def records(transport: Any) -> list[dict[str, Any]]:
    return [r for r in transport.records if "loss" in r and not r.get("control")]


def test_records_name_samples_and_sources_from_the_loader() -> None:
    model, opt, loader, probe, transport = setup(max_steps=4)
    seen: list[tuple[list[str], list[str], dict[str, tuple[float, int]]]] = []
    for batch in loader:  # the loader runs the step boundary and ends at max_steps
        sums, tokens = per_sample(model, batch)
        (sums.sum() / tokens.sum()).backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        by_source: dict[str, tuple[float, int]] = {}
        for src, s, t in zip(batch["sources"], sums.tolist(), tokens.tolist(), strict=True):
            a, b = by_source.get(src, (0.0, 0))
            by_source[src] = (a + s, b + t)
        seen.append((list(batch["sample_ids"]), list(batch["sources"]), by_source))
        probe.record(loss_sum=sums, tokens=tokens, grad_norm=gn)  # per-sample sums: per-source losses
    probe.close()
    recs = records(transport)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    for rec, (ids, _, by_source) in zip(recs, seen, strict=True):
        assert rec["samples"] == ids and "batch" in rec["attrs"]
        assert rec["tokens"] == sum(t for _, t in by_source.values())
        assert set(rec["sources"]) == set(by_source)
        for src, (s, t) in by_source.items():
            assert rec["sources"][src]["tokens"] == t
            assert rec["sources"][src]["loss_sum"] == pytest.approx(s, rel=1e-6)
        assert rec["loss"] == pytest.approx(sum(s for s, _ in by_source.values()) / rec["tokens"], rel=1e-6)
    assert [r["attrs"]["batch"] for r in recs] == [0, 1, 2, 3]


def test_micro_batches_of_one_step_are_named_and_the_boundary_waits_for_the_step() -> None:
    """Accumulation: every micro-batch drawn for the step is named; a directive lands between steps."""
    model, opt, loader, probe, transport = setup(max_steps=3)
    drawn: list[list[str]] = []
    batches = iter(loader)
    transport.deliver(ApplyOverrides(lr_scale=0.5, id="a1"))
    try:
        while True:
            parts, ids = [], []
            for _ in range(2):  # two micro-batches; the boundary runs only before the first
                batch = next(batches)
                ids += batch["sample_ids"]
                sums, tokens = per_sample(model, batch)
                (sums.sum() / tokens.sum() / 2).backward()
                parts.append(sdk.StepLoss(sums.sum(), tokens.sum(), sums, tokens))
            opt.step()
            opt.zero_grad()
            drawn.append(ids)
            probe.record(parts)  # one StepLoss per micro-batch
    except StopIteration:
        pass
    probe.close()
    recs = records(transport)
    assert [r["samples"] for r in recs] == drawn and all(len(ids) == 2 * BATCH for ids in drawn)
    assert [r["attrs"]["batch"] for r in recs] == [0, 2, 4]  # the first global batch of each step
    assert all(r.get("sources") for r in recs)


def test_a_source_excluded_by_the_policy_never_comes_back() -> None:
    model, opt, loader, probe, transport = setup(max_steps=8)
    victim = None
    for batch in loader:
        if probe.step_count == 2 and victim is None:
            victim = batch["sources"][0]
            transport.deliver(ApplyOverrides(exclusions=Exclusions(sources=(victim,)), id="ex"))
        sums, tokens = per_sample(model, batch)
        (sums.sum() / tokens.sum()).backward()
        opt.step()
        opt.zero_grad()
        probe.record(loss_sum=sums, tokens=tokens)
    probe.close()
    recs = records(transport)
    events = [e for r in transport.records for e in r.get("events", [])]
    assert any(e.startswith("directive_applied:ex") for e in events), events
    assert victim is not None and any(victim in r["sources"] for r in recs[:3])
    later = recs[4:]
    assert later and all(victim not in r["sources"] for r in later)
    assert all(not s.startswith(f"{victim}:") for r in later for s in r["samples"])


def test_a_restarted_process_resumes_the_loader_inside_watch(tmp_path: Path) -> None:
    """What a supervised restart does: sdk.watch loads the checkpoint, the loader's cursor included."""
    from types import SimpleNamespace

    store = CheckpointStore(open_backend(str(tmp_path)), "job")
    model, opt, loader, probe, transport = setup(max_steps=4, store=store, checkpoint_every=2)
    first: dict[int, list[str]] = {}
    for batch in loader:
        sums, tokens = per_sample(model, batch)
        (sums.sum() / tokens.sum()).backward()
        opt.step()
        opt.zero_grad()
        probe.record(loss_sum=sums.sum(), tokens=tokens.sum())
        first[probe.step_count] = list(batch["sample_ids"])
    probe.close()
    model2 = TinyLM(TinyLMConfig(seq_len=16, d_model=16, n_layers=1, n_heads=2))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    loader2 = sdk.SupervisedLoader(build_dataset(16, 3_000, 0), BATCH, seed=0, collate_fn=collate)
    ctx = SimpleNamespace(rank=0, world_size=1, transport=sdk.MemoryTransport(flush_interval_s=0.01),
                          checkpoint_store=store, resume_step=2, job=None)  # fmt: skip
    probe2 = sdk.watch(model2, opt2, loader=loader2, ctx=ctx, max_steps=4)
    assert probe2.step_count == 2
    batch = next(iter(loader2))
    assert batch["sample_ids"] == first[3]  # the cursor came back with the checkpoint
    probe2.close()


def test_rollback_in_place_rewinds_the_loader(tmp_path: Path) -> None:
    store = CheckpointStore(open_backend(str(tmp_path)), "job")
    model, opt, loader, probe, transport = setup(max_steps=6, store=store, checkpoint_every=2)
    named: dict[int, list[str]] = {}
    replayed: list[tuple[int, bool]] = []
    sent = False
    for batch in loader:
        step = probe.step_count + 1
        if step in named:
            replayed.append((step, batch["sample_ids"] == named[step]))
        named.setdefault(step, list(batch["sample_ids"]))
        sums, tokens = per_sample(model, batch)
        (sums.sum() / tokens.sum()).backward()
        opt.step()
        opt.zero_grad()
        probe.record(loss_sum=sums, tokens=tokens)
        if probe.step_count == 4 and not sent:
            transport.deliver(RollbackInPlace(step=2, id="rb"))
            sent = True
    probe.close()
    # Rolled back to 2 at the boundary after step 4: steps 3 and 4 train on their own batches again.
    assert replayed[:2] == [(3, True), (4, True)], replayed
    assert [r["step"] for r in records(transport)] == [1, 2, 3, 4, 3, 4, 5, 6]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"loss": torch.ones(BATCH)}, "loss"),  # per-sample values where the step's mean goes
        ({"loss_sum": torch.ones(BATCH), "tokens": torch.tensor(64)}, "tokens"),  # sums per sample, one count
        ({"loss_sum": torch.ones(BATCH), "tokens": torch.ones(BATCH + 1)}, "tokens"),
        ({"loss_sum": torch.ones(2, 2), "tokens": torch.ones(2, 2)}, "loss_sum"),
        ({"loss_sum": torch.ones(BATCH + 1), "tokens": torch.ones(BATCH + 1)}, "loss_sum"),  # not the batch's
        ({"loss_sum": torch.tensor(3.0)}, "tokens"),
        ({"loss": torch.tensor(1.0), "loss_sum": torch.tensor(3.0), "tokens": 3}, "loss"),
        ({"loss": "1.0"}, "loss"),
        ({"loss": torch.tensor(1.0), "grad_norm": torch.ones(3)}, "grad_norm"),
        ({}, "loss"),
    ],
)
def test_bad_record_arguments_are_refused_in_one_line_naming_them(
    kwargs: dict[str, Any], argument: str
) -> None:
    model, opt, loader, probe, transport = setup(max_steps=2)
    batch = next(iter(loader))
    model(batch["input_ids"]).sum().backward()
    opt.step()
    with pytest.raises(SupervisorError) as info:
        probe.record(**kwargs)
    line = str(info.value)
    assert "\n" not in line and f"{argument}=" in line, line
    probe.close()


def test_bad_watch_arguments_are_refused_in_one_line_naming_them() -> None:
    model = TinyLM(TinyLMConfig(seq_len=16, d_model=16, n_layers=1, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.utils.data.DataLoader(build_dataset(16, 3_000, 0), batch_size=BATCH, collate_fn=collate)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    cases = [
        ({"loader": data}, "loader"),  # a torch DataLoader names no samples and takes no exclusions
        ({"max_step": 3}, "max_step"),  # a misspelt setting
        ({"grad_clip": "high"}, "grad_clip"),
    ]
    for kwargs, argument in cases:
        with pytest.raises(SupervisorError) as info:
            sdk.watch(model, opt, transport=transport, **kwargs)
        line = str(info.value)
        assert "\n" not in line and argument in line, line
    with pytest.raises(SupervisorError, match="optimizer"):
        sdk.watch(model, object(), transport=transport)  # type: ignore[arg-type]


def test_a_loop_without_the_loader_reports_per_source_losses_through_batch() -> None:
    """A script's own DataLoader: ``batch=`` a mapping with ``sources`` gives the per-source split."""
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=16, d_model=16, n_layers=1, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.watch(model, opt, transport=transport, max_steps=1)
    batch = collate([build_dataset(16, 3_000, 0)[i] for i in range(BATCH)])
    sources = ["web", "code", "web", "code"]
    sums, tokens = per_sample(model, batch)
    (sums.sum() / tokens.sum()).backward()
    opt.step()
    probe.record(loss_sum=sums, tokens=tokens, batch={"sources": sources})
    probe.close()
    (rec,) = records(transport)
    for name in ("web", "code"):
        picked = [i for i, s in enumerate(sources) if s == name]
        assert rec["sources"][name]["loss_sum"] == pytest.approx(float(sums[picked].sum()), rel=1e-6)
        assert rec["sources"][name]["tokens"] == int(tokens[picked].sum())
    assert "samples" not in rec
    with pytest.raises(SupervisorError, match=r"loss_sum=.*4 per-sample sums.*3 samples"):
        probe2 = sdk.watch(model, opt, transport=transport, max_steps=1)
        probe2.record(loss_sum=sums, tokens=tokens, batch={"sources": sources[:3]})
