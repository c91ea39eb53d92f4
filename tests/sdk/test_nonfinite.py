"""A non-finite step is caught, localized by a replay with hooks, and (without AMP) skipped."""

from __future__ import annotations

import math

import torch

from examples.tinylm.model import lm_loss
from supervisor.sdk.nonfinite import localize_nonfinite
from tests.sdk.conftest import make_run, records, train


class NanGrad(torch.autograd.Function):
    """Identity forward; NaN gradient backward: a fault that only shows in the backward pass."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * math.nan


def test_forward_nan_is_named_and_step_skipped(dataset):
    model, _, _, loader, probe, transport = make_run(dataset)
    train(model, loader, probe, 2)
    handle = model.blocks[1].mlp.fc.register_forward_hook(lambda m, i, out: out * math.inf)
    before = [p.detach().clone() for p in model.parameters()]
    train(model, loader, probe, 1)
    handle.remove()
    rec = records(probe, transport)[-1]
    assert rec["nonfinite"] is True and rec["nonfinite_at"] == "forward:blocks.1.mlp.fc"
    assert "step_skipped_nonfinite" in rec["events"]
    assert all(
        torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=False)
    )  # state kept clean
    assert rec["update_norm"] == 0.0
    train(model, loader, probe, 1)
    assert records(probe, transport)[-1]["nonfinite"] is False


def test_backward_nan_names_the_first_parameter(dataset):
    model, _, _, loader, probe, transport = make_run(dataset)
    handle = model.blocks[0].attn.register_forward_hook(lambda m, i, out: NanGrad.apply(out))
    train(model, loader, probe, 1)
    handle.remove()
    rec = records(probe, transport)[-1]
    assert math.isfinite(rec["loss"]) and not math.isfinite(rec["grad_norm"])
    assert rec["nonfinite_at"].startswith("grad:blocks.0.attn.proj")


def test_corrupt_parameter_is_named_first(dataset):
    model = make_run(dataset)[0]
    batch = make_run(dataset)[3].next_batch()
    with torch.no_grad():
        model.blocks[0].ln1.weight[3] = math.nan
    assert localize_nonfinite(model, lambda m: lm_loss(m, batch).loss) == "param:blocks.0.ln1.weight"


def test_healthy_step_localizes_nothing_and_leaves_grads(dataset):
    model = make_run(dataset)[0]
    batch = make_run(dataset)[3].next_batch()
    assert localize_nonfinite(model, lambda m: lm_loss(m, batch).loss) is None
    assert all(p.grad is None for p in model.parameters())
