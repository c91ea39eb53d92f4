"""Any nn.Module / optimizer / scheduler, with a plain DataLoader: the probe still measures and steers."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from supervisor import sdk
from supervisor.sdk import StepLoss


def test_mlp_with_sgd_steplr_and_a_plain_dataloader():
    torch.manual_seed(0)
    x, y = torch.randn(256, 8), torch.randn(256, 1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    transport = sdk.MemoryTransport()
    probe = sdk.init(model, opt, scheduler=sched, transport=transport, grad_clip=0.5, sample_stride=1)
    expected_norms = []
    for step, (xb, yb) in enumerate(DataLoader(TensorDataset(x, y), batch_size=32)):
        if step == 5:
            transport.deliver(sdk.Stop(id="halt"))
        if not probe.proceed():
            break
        with probe.step({"x": xb}) as s:
            err = (model(xb) - yb).square()
            s.backward(StepLoss(err.sum(), torch.tensor(err.numel())))
            grads = [p.grad.detach().clone() for p in model.parameters()]
            expected_norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
            s.optimizer_step()
    probe.close()
    recs = [r for r in transport.records if not r.get("control")]
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5] and probe.should_stop
    assert [r["lr"] for r in recs] == [0.1, 0.1, 0.1, 0.05, 0.05]
    assert [r["grad_norm"] for r in recs] == pytest.approx(expected_norms, rel=1e-6)
    assert all(r["update_norm"] > 0 and "sources" not in r for r in recs)
    assert "directive_applied:halt:stop" in recs[-1]["events"]
