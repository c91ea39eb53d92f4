"""Each metric of the record against an independent computation on a real small model."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from examples.tinylm.model import lm_loss
from supervisor.sdk.metrics import NormSampler, Pack, grad_norm
from tests.sdk.conftest import make_run, records, train


def test_grad_norm_matches_clip_grad_norm(dataset):
    model, opt, _, loader, probe, transport = make_run(dataset, grad_clip=0.05)
    twin = copy.deepcopy(model)
    batch = loader.next_batch()
    lm_loss(twin, batch).loss.backward()
    expected = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.05).item()
    with probe.step(batch) as s:
        s.backward(lm_loss(model, batch))
        got_grads = None
        s.optimizer_step()
    (rec,) = records(probe, transport)
    assert rec["grad_norm"] == pytest.approx(expected, rel=1e-6)
    assert got_grads is None  # the probe zeroes grads after the step
    assert all(p.grad is None for p in model.parameters())


def test_clipping_is_applied_before_the_step(dataset):
    model = make_run(dataset)[0]
    params = list(model.parameters())
    batch = make_run(dataset)[3].next_batch()
    lm_loss(model, batch).loss.backward()
    total = grad_norm(params, 1e-3)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
    assert total.item() > 1e-2
    assert clipped.item() == pytest.approx(1e-3, rel=1e-3)


def test_token_weighted_loss_and_source_split(dataset):
    model, _, _, loader, probe, transport = make_run(dataset, batch_size=8)
    twin = copy.deepcopy(model)
    batches = []
    for batch in loader:
        batches.append(batch)
        with probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
        if len(batches) == 3:
            break
    recs = records(probe, transport)
    # The first record was computed with the initial weights: recompute it on the twin.
    b = batches[0]
    logits = twin(b["input_ids"])
    per_tok = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), b["targets"].flatten(), reduction="none"
    )
    mask = (b["targets"] != -100).flatten()
    assert recs[0]["loss"] == pytest.approx((per_tok[mask].sum() / mask.sum()).item(), rel=1e-5)
    assert recs[0]["tokens"] == int(mask.sum())
    for rec in recs:
        src = rec["sources"]
        assert sum(v["tokens"] for v in src.values()) == rec["tokens"]
        assert sum(v["loss_sum"] for v in src.values()) == pytest.approx(rec["loss_sum"], rel=1e-6)
        assert math.isfinite(rec["batch_mean_loss"])
        assert len(rec["samples"]) == 8 and rec["step"] == recs.index(rec) + 1


def test_batch_mean_differs_from_token_weighted_with_padding(dataset):
    model, _, _, loader, probe, transport = make_run(dataset)
    batch = loader.next_batch()
    batch["targets"][0, 4:] = -100  # one short sample: batch-mean and token-weighted now differ
    with probe.step(batch) as s:
        s.backward(lm_loss(model, batch))
        s.optimizer_step()
    (rec,) = records(probe, transport)
    out = lm_loss(make_run(dataset)[0], batch)
    means = out.sample_loss_sum / out.sample_tokens
    assert rec["batch_mean_loss"] == pytest.approx(means.mean().item(), rel=1e-5)
    assert rec["batch_mean_loss"] != pytest.approx(rec["loss"], rel=1e-4)


@pytest.mark.parametrize("stride,rel", [(1, 1e-6), (31, 0.1)])
def test_update_norm_vs_explicit_copy(dataset, stride, rel):
    model, opt, _, loader, probe, transport = make_run(dataset, sample_stride=stride, exact_below=64)
    train(model, loader, probe, 3)
    before = [p.detach().clone() for p in model.parameters()]
    train(model, loader, probe, 1)
    after = list(model.parameters())
    expected = math.sqrt(
        sum(
            ((a.detach().double() - b.double()) ** 2).sum().item()
            for a, b in zip(after, before, strict=False)
        )
    )
    expected_param = math.sqrt(sum((a.detach().double() ** 2).sum().item() for a in after))
    rec = records(probe, transport)[-1]
    assert rec["step"] == 4
    assert rec["update_norm"] == pytest.approx(expected, rel=rel)
    assert rec["param_norm"] == pytest.approx(expected_param, rel=rel / 5)
    assert probe.sampler.memory_fraction <= (1.0 if stride == 1 else 0.05)


def test_update_norm_sample_is_small_and_close_on_a_larger_model():
    torch.manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(256, 256)),
        torch.nn.Parameter(torch.randn(1024, 64)),
        torch.nn.Parameter(torch.randn(64)),
    ]
    sampler = NormSampler(params, stride=31, exact_below=1024)
    sampler.measure()
    before = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:  # an Adam-like update: sign-ish, with varying magnitude
            p.add_(torch.randn_like(p).sign() * torch.rand_like(p) * 1e-3)
    _, update_sq = sampler.measure()
    exact = math.sqrt(sum(((p.detach() - b) ** 2).sum().item() for p, b in zip(params, before, strict=False)))
    assert math.sqrt(update_sq.item()) == pytest.approx(exact, rel=0.03)
    assert sampler.memory_fraction < 0.04


def test_fingerprint_every_k_and_exact_param_norm(dataset):
    model, _, _, loader, probe, transport = make_run(dataset, fingerprint_every=2)
    train(model, loader, probe, 4)
    recs = records(probe, transport)
    have = [r["step"] for r in recs if "param_checksum" in r]
    assert have == [2, 4]
    exact = math.sqrt(sum((p.detach().double() ** 2).sum().item() for p in model.parameters()))
    assert recs[-1]["attrs"]["param_norm_exact"] == pytest.approx(exact, rel=1e-6)


def test_one_packed_copy_per_step(dataset, monkeypatch):
    model, _, _, loader, probe, transport = make_run(dataset, fingerprint_every=2, canary_every=2)
    calls = []
    real = Pack.start
    monkeypatch.setattr(Pack, "start", lambda self: calls.append(1) or real(self))
    train(model, loader, probe, 5)
    assert len(calls) == 5  # no host read here: tests/sdk/test_no_host_sync.py
    recs = records(probe, transport)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    assert all("canary_loss" in r["attrs"] for r in recs if r["step"] % 2 == 0)


def test_lr_and_step_time_reported(dataset):
    model, opt, sched, loader, probe, transport = make_run(dataset)
    train(model, loader, probe, 3)
    recs = records(probe, transport)
    assert [r["lr"] for r in recs] == pytest.approx([3e-3 * (k + 1) / 5 for k in range(3)])
    assert all(r["step_time"] > 0 and r["tokens_per_s"] > 0 for r in recs)


def test_sampled_norms_sum_in_float32_as_precisely_as_in_float64():
    """The sample's weighted squares are summed in float32 (torch's blocked reduction, 3x faster
    than a float64 accumulator on CPU): over 4M elements spanning six orders of magnitude the sum
    stays within 1e-6 of the float64 one."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(2048, 1024) * 10 ** torch.randint(-3, 3, (2048, 1)).float())
              for _ in range(2)]  # fmt: skip
    sampler = NormSampler(params, stride=1)
    sampler.measure()
    with torch.no_grad():
        for p in params:
            p.mul_(1.001)
    param_sq, update_sq = sampler.measure()
    exact = sum(float((p.detach().double() ** 2).sum()) for p in params)
    assert param_sq.dtype == torch.float64
    assert param_sq.item() == pytest.approx(exact, rel=1e-6)
    assert update_sq is not None and update_sq.item() == pytest.approx(exact * (0.001 / 1.001) ** 2, rel=1e-3)
