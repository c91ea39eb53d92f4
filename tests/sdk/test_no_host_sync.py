"""No host read of a step's own values inside ``probe.step``: its telemetry reaches the host a step later.

On CPU a ``TorchDispatchMode`` records every storage an op writes during the step and counts the
reads of those storages by the host (``aten._local_scalar_dense``: ``item``/``bool``/``float``;
``tolist``/``numpy``). Reading the previous step's copy is allowed (it was written a step ago).
On CUDA the same steps run under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from examples.tinylm.data import collate
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk
from tests.sdk.conftest import SEQ, records


def _ptr(t: Any) -> int:
    try:
        return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else 0
    except (RuntimeError, NotImplementedError):
        return 0


class HostReads(TorchDispatchMode):
    """Host reads of tensors written since ``mark()``."""

    def __init__(self) -> None:
        super().__init__()
        self.written: set[int] = set()
        self.reads: list[str] = []

    def mark(self) -> None:
        self.written.clear()

    def fresh(self, t: Any) -> bool:
        p = _ptr(t)
        return p != 0 and p in self.written

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._local_scalar_dense.default and self.fresh(args[0]):
            self.reads.append(str(func))
        out = func(*args, **(kwargs or {}))
        self.written.update(p for p in map(_ptr, tree_leaves(out)) if p)
        return out


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostReads]:
    mode = HostReads()
    for name in ("tolist", "numpy"):
        real = getattr(torch.Tensor, name)

        def wrapped(self: torch.Tensor, *a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            if mode.fresh(self):
                mode.reads.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    with mode:
        yield mode
    monkeypatch.undo()


def _run(dataset: Any, *, fused: bool = True, scaler: Any = None, **settings: Any) -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=SEQ, d_model=32, n_layers=2, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    loader = sdk.SupervisedLoader(dataset, 4, seed=0, collate_fn=collate, rank=0, world_size=1)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.init(model, opt, scheduler=sched, scaler=scaler, loader=loader, loss_fn=lm_loss,
                     transport=transport, grad_clip=1.0, canary_batch=loader.fixed_batch(), **settings)  # fmt: skip
    return model, opt, loader, probe, transport


def _steps(model: Any, loader: Any, probe: Any, mode: HostReads, n: int, *, poison_at: int = 0,
           extra_read: bool = False) -> list[int]:  # fmt: skip
    """Reads counted inside each ``probe.step`` (the loader's boundary runs outside it)."""
    per_step = []
    for i, batch in enumerate(loader):
        before = len(mode.reads)
        mode.mark()
        with probe.step(batch) as s:
            out = lm_loss(model, batch)
            if i + 1 == poison_at:
                out = sdk.StepLoss(out.loss_sum * math.nan, out.tokens, None, None)
            if extra_read:
                out.loss.item()  # the counter itself: a read of this step's value is seen
            s.backward(out)
            s.optimizer_step()
        per_step.append(len(mode.reads) - before)
        if i + 1 == n:
            break
    return per_step


def test_a_read_of_the_steps_own_value_is_counted(dataset, monkeypatch):
    model, _, loader, probe, _ = _run(dataset)
    with counting(monkeypatch) as mode:
        assert _steps(model, loader, probe, mode, 2, extra_read=True) == [1, 1]


def test_probed_steps_read_nothing_of_their_own_on_the_host(dataset, monkeypatch):
    # fingerprint and canary every 2 steps, sampled norms, per-source split: the default probe and more
    model, _, loader, probe, transport = _run(dataset, fingerprint_every=2, canary_every=2)
    with counting(monkeypatch) as mode:
        assert _steps(model, loader, probe, mode, 6) == [0] * 6
    recs = records(probe, transport)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]  # each arrives, one step late
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["update_norm"] > 0 for r in recs)
    assert all("param_checksum" in r and "canary_loss" in r["attrs"] for r in recs if r["step"] % 2 == 0)


def test_amp_scaler_with_a_fused_optimizer_reads_nothing(dataset, monkeypatch):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    model, _, loader, probe, transport = _run(dataset, scaler=scaler)
    with counting(monkeypatch) as mode:
        assert _steps(model, loader, probe, mode, 3) == [0] * 3
    recs = records(probe, transport)
    assert [r["loss_scale"] for r in recs] == [2.0**10] * 3 and not any(r["overflow"] for r in recs)


def test_a_nonfinite_step_is_skipped_on_the_device_and_localized_a_step_later(dataset, monkeypatch):
    model, _, loader, probe, transport = _run(dataset)
    with counting(monkeypatch) as mode:
        reads = _steps(model, loader, probe, mode, 2)
        state = [p.detach().clone() for p in model.parameters()]
        reads += _steps(model, loader, probe, mode, 1, poison_at=1)
        assert all(torch.equal(a, b) for a, b in zip(state, model.parameters(), strict=True))
        assert reads == [0, 0, 0]  # the skip itself needed no host read
        _steps(model, loader, probe, mode, 1)  # step 4 reads step 3's record and replays its batch
    recs = records(probe, transport)
    bad = recs[2]
    assert bad["step"] == 3 and bad["nonfinite"] and "step_skipped_nonfinite" in bad["events"]
    assert bad["nonfinite_at"] == "unknown"  # the loss was poisoned outside the model: replay finds it clean
    assert bad["update_norm"] == 0.0 and recs[3]["update_norm"] > 0


def test_an_optimizer_that_cannot_skip_on_the_device_costs_one_flag_read(dataset, monkeypatch):
    model, opt, loader, probe, transport = _run(dataset, fused=False)
    with counting(monkeypatch) as mode:
        batch = loader.fixed_batch()
        mode.mark()
        lm_loss(model, batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()  # the plain loop's own reads: this optimizer reads its step counters
        opt.zero_grad(set_to_none=True)
        plain = len(mode.reads)
        assert _steps(model, loader, probe, mode, 3) == [plain + 1] * 3
    assert [r["step"] for r in records(probe, transport)] == [1, 2, 3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_probed_steps_do_not_synchronize_cuda(dataset):
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=SEQ, d_model=64, n_layers=2, n_heads=2)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    loader = sdk.SupervisedLoader(dataset, 4, seed=0, collate_fn=collate, rank=0, world_size=1)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.init(model, opt, loader=loader, loss_fn=lm_loss, transport=transport, grad_clip=1.0)
    batches = [
        {
            k: v.pin_memory().cuda(non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in b.items()
        }
        for _, b in zip(range(8), loader, strict=False)
    ]
    for i, batch in enumerate(batches):
        if i == 2:  # after the first steps' one-time allocations
            torch.cuda.set_sync_debug_mode("error")
        try:
            with probe.step(batch) as s:
                s.backward(lm_loss(model, batch))
                s.optimizer_step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    recs = records(probe, transport)
    assert [r["step"] for r in recs] == list(range(1, 9))
