"""AMP: the scaler's state is reported, an overflow is an overflow (not a non-finite incident)."""

from __future__ import annotations

import torch

from examples.tinylm.data import collate
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk
from tests.sdk.conftest import records, train


def test_overflow_is_reported_and_skipped_by_the_scaler(dataset):
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=32, d_model=32, n_layers=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1000)
    loader = sdk.SupervisedLoader(dataset, 4, seed=0, collate_fn=collate, rank=0, world_size=1)
    transport = sdk.MemoryTransport()
    probe = sdk.init(model, opt, scaler=scaler, loader=loader, loss_fn=lm_loss, transport=transport)
    train(model, loader, probe, 3)
    recs = records(probe, transport)
    assert recs[0]["overflow"] is True and recs[0]["nonfinite"] is False
    assert recs[0]["loss_scale"] == 2.0**127 and recs[1]["loss_scale"] < recs[0]["loss_scale"]
    assert recs[0]["update_norm"] == 0.0 or "update_norm" not in recs[0]
    assert recs[-1]["overflow"] is False and recs[-1]["grad_norm"] < 100  # unscaled before measuring
