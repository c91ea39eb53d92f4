"""Sample text never leaves the training process: not in records, log lines or incident files."""

from __future__ import annotations

import json

from examples.tinylm.data import build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk
from supervisor.core.analysis import analyze_records
from supervisor.core.records import Record
from tests.sdk.conftest import poisoned

CANARY = "CANARY-ZX81-QUOKKA"


def test_canary_text_appears_nowhere(tmp_path, capfd):
    secret = {"secret": {"vault.txt": f"The password is {CANARY}. " * 150}}
    ds = build_dataset(seq_len=32, max_bytes_per_source=10_000, extra_texts=secret)
    model = TinyLM(TinyLMConfig(seq_len=32, d_model=32, n_layers=1))
    opt = torch_adamw(model)
    loader = sdk.SupervisedLoader(ds, 8, seed=0, collate_fn=collate, rank=0, world_size=1)
    trace = tmp_path / "trace.jsonl"
    probe = sdk.init(
        model, opt, loader=loader, loss_fn=lm_loss, trace=trace, fingerprint_every=5, max_steps=30
    )
    for batch in loader:
        # A non-finite step at 25, so that an incident (with its samples) exists.
        with poisoned(model.blocks[0].mlp, probe.step_count == 25), probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
    probe.close()

    text = trace.read_text()
    assert '"secret:vault.txt:' in text  # the secret text was trained on (by ID)
    result = analyze_records(Record.from_dict(json.loads(line)) for line in text.splitlines())
    assert result.incidents, "expected the non-finite step to open an incident"
    incident_json = json.dumps([d.to_json() for d in result.incidents])
    out, err = capfd.readouterr()
    for where in (text, incident_json, out, err):
        assert CANARY not in where and "password is" not in where


def torch_adamw(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-3)
