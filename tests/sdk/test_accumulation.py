"""Gradient accumulation in one ``probe.step``: the record holds the step's true numbers.

The reference is the same step computed without the SDK: one token-weighted mean loss over the
whole batch, its gradient, its norm and one SGD update. Micro-batches get unequal token counts
(some targets masked), so a mean of micro-batch means or a sum of their gradients would differ.
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from typing import Any

import pytest
import torch

from examples.tinylm.data import collate
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk
from supervisor.errors import SupervisorError
from tests.sdk.conftest import SEQ, records

BATCH = 8


def _setup(dataset: Any) -> tuple[Any, Any, dict[str, Any]]:
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=SEQ, d_model=32, n_layers=2, n_heads=2))
    loader = sdk.SupervisedLoader(dataset, BATCH, seed=0, collate_fn=collate, rank=0, world_size=1)
    batch = next(iter(loader))
    targets = batch["targets"].clone()
    for i in range(BATCH):  # unequal tokens per sample, hence per micro-batch
        targets[i, SEQ - 3 * i - 1 :] = -100
    batch["targets"] = targets
    return model, loader, batch


def _autocast(bf16: bool) -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()


def _reference(model: Any, batch: dict[str, Any], n: int, bf16: bool) -> tuple[float, int, float, list[Any]]:
    """(loss, tokens, grad norm, parameters after one SGD step) of the step's mean loss, no SDK."""
    model = copy.deepcopy(model)
    parts = []
    for mb in sdk_split(batch, n):
        with _autocast(bf16):
            parts.append(lm_loss(model, mb))
    total = sum(p.tokens for p in parts)
    loss = sum(p.loss_sum for p in parts) / total
    loss.backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return loss.item(), int(total), norm, [p.detach().clone() for p in model.parameters()]


def sdk_split(batch: dict[str, Any], n: int) -> list[dict[str, Any]]:
    from supervisor.sdk.step import split_batch

    return split_batch(batch, n)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_accumulated_step_records_the_true_loss_tokens_grad_norm_and_samples(dataset, n, bf16):
    model, loader, batch = _setup(dataset)
    want_loss, want_tokens, want_norm, want_params = _reference(model, batch, n, bf16)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.init(model, opt, loss_fn=lm_loss, transport=transport, fingerprint_every=0)
    with probe.step(batch, micro_batches=n) as s:
        for mb in s.micro_batches():
            with _autocast(bf16):
                out = lm_loss(model, mb)
            s.backward(out)
        s.optimizer_step()
    (rec,) = records(probe, transport)
    tol = 2e-3 if bf16 else 1e-5
    assert rec["tokens"] == want_tokens
    assert rec["loss"] == pytest.approx(want_loss, rel=tol)
    assert rec["grad_norm"] == pytest.approx(want_norm, rel=tol)
    # the gradient applied: the same update as the reference (bf16 rounds the backward differently)
    got = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(model.parameters(), before, strict=True)])
    want = torch.cat([(w - b).reshape(-1) for w, b in zip(want_params, before, strict=True)])
    assert (got - want).norm() / want.norm() < (1e-2 if bf16 else 1e-5)
    if n == 1:
        assert "micro_batches" not in rec.get("attrs", {})
        return
    micro = rec["attrs"]["micro_batches"]
    slices = sdk_split(batch, n)
    assert [m["samples"] for m in micro] == [mb["sample_ids"] for mb in slices]
    assert [m["tokens"] for m in micro] == [int((mb["targets"] != -100).sum()) for mb in slices]
    assert sum(m["loss_sum"] for m in micro) == pytest.approx(rec["loss_sum"], rel=1e-9)
    assert rec["samples"] == batch["sample_ids"] and len({m["tokens"] for m in micro}) > 1


def test_accumulated_grad_norm_equals_the_whole_batch_step(dataset):
    """The report's case: two backward calls must not double the gradient (grad_clip would act at 0.5)."""
    norms = []
    for n in (1, 2):
        model, _, batch = _setup(dataset)
        transport = sdk.MemoryTransport(flush_interval_s=0.01)
        probe = sdk.init(model, torch.optim.SGD(model.parameters(), lr=0.1), transport=transport)
        with probe.step(batch) as s:  # undeclared on one rank: each s.backward is a micro-batch
            for mb in sdk_split(batch, n):
                s.backward(lm_loss(model, mb), batch=mb)
            s.optimizer_step()
        norms.append(records(probe, transport)[0]["grad_norm"])
    assert norms[1] == pytest.approx(norms[0], rel=1e-5)


def test_a_declared_count_must_match_the_backward_calls(dataset):
    model, _, batch = _setup(dataset)
    probe = sdk.init(model, torch.optim.SGD(model.parameters(), lr=0.1), transport=sdk.MemoryTransport())
    with (
        pytest.raises(SupervisorError, match="micro_batches=4.*ran 2"),
        probe.step(batch, micro_batches=4) as s,
    ):
        for mb in sdk_split(batch, 2):
            s.backward(lm_loss(model, mb))
        s.optimizer_step()
    with pytest.raises(SupervisorError, match="9"):
        sdk_split(batch, 9)
    assert math.isfinite(sum(p.sum().item() for p in model.parameters()))


def test_two_ranks_accumulate_to_the_global_token_weighted_mean(tmp_path):
    """DDP over gloo, 2 ranks x 2 declared micro-batches with unequal tokens everywhere: the update
    every rank applies is the one step of the global token-weighted mean loss, and each rank's record
    holds its own loss, tokens and the global grad norm."""
    import json

    import torch.multiprocessing as mp

    from tests.sdk import accum_worker as w

    mp.spawn(w.run, args=(2, str(tmp_path)), nprocs=2, join=True)
    net = w.model()
    batches = [w.batch_of(r, 2) for r in range(2)]
    parts = [[lm_loss(net, mb) for mb in sdk_split(b, w.MICRO)] for b in batches]
    total = sum(p.tokens for rank in parts for p in rank)
    (sum(p.loss_sum for rank in parts for p in rank) / total).backward()
    want_norm = torch.nn.utils.get_total_norm([p.grad for p in net.parameters()]).item()
    want = torch.cat([(-w.LR * p.grad).reshape(-1) for p in net.parameters()])
    for rank in range(2):
        got = torch.tensor(json.loads((tmp_path / f"delta.rank{rank}.json").read_text()))
        assert (got - want).norm() / want.norm() < 1e-5, rank
        (rec,) = [json.loads(x) for x in (tmp_path / f"trace.rank{rank}.jsonl").read_text().splitlines()
                  if not json.loads(x).get("control")]  # fmt: skip
        mine = parts[rank]
        assert rec["tokens"] == int(sum(p.tokens for p in mine))
        own = sum(p.loss_sum for p in mine) / sum(p.tokens for p in mine)
        assert rec["loss"] == pytest.approx(own.item(), rel=1e-5)
        assert rec["grad_norm"] == pytest.approx(want_norm, rel=1e-5)
    assert int(parts[0][0].tokens) != int(
        parts[1][0].tokens
    )  # the ranks' divisors differ: the case that matters
