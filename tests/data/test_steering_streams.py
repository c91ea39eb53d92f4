"""The SDK's rollback and restart with a streaming loader and 2 worker processes, end to end.

Real tinylm training through the probe, a real checkpoint store on disk, a Hugging Face
streaming dataset read from local JSONL files by 2 DataLoader workers. The supervisor's
``RollbackInPlace`` (with exclusions) goes through steering exactly as at runtime.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from examples.tinylm.data import StreamCollate
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk
from supervisor.checkpoint import CheckpointStore
from supervisor.storage import open_backend
from tests.data.conftest import SEQ, hf_stream
from tests.sdk.conftest import records, train

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


def run(files: list[str], store: CheckpointStore) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=SEQ, d_model=32, n_layers=1, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = sdk.SupervisedLoader(
        hf_stream(files), 4, seed=0, rank=0, world_size=1, collate_fn=StreamCollate(SEQ), num_workers=2
    )
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.init(model, opt, loader=loader, loss_fn=lm_loss, transport=transport, checkpoint=store,
                     checkpoint_every=3)  # fmt: skip
    return model, loader, probe, transport


def samples_by_step(probe: Any, transport: Any, since: float = 0.0) -> dict[int, list[str]]:
    return {r["step"]: r["samples"] for r in records(probe, transport) if r["time"] > since}


@pytest.mark.slow
def test_rollback_with_exclusions_and_restart_through_steering(jsonl_shards, tmp_path):
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    model, loader, probe, transport = run(jsonl_shards, store)
    train(model, loader, probe, 6)
    first = samples_by_step(probe, transport)
    mark = max(r["time"] for r in records(probe, transport))
    bad = tuple(first[5][:2])  # step 5 came after checkpoint 3
    transport.deliver(sdk.RollbackInPlace(step=3, exclusions=sdk.Exclusions(samples=bad), id="rb"))
    train(model, loader, probe, 8)  # steps 4..11 of the new timeline
    again = samples_by_step(probe, transport, mark)
    assert again[4] == first[4]  # worker 1's batch: untouched
    assert again[5][:2] == first[5][2:]  # worker 0's stream, minus the two excluded samples
    assert not set(bad) & {s for ids in again.values() for s in ids}
    probe.close()
    loader.close()
    # A group restart: fresh model, loader (new worker processes) and probe, restored from step 9.
    model2, loader2, probe2, transport2 = run(jsonl_shards, store)
    probe2.steering.restore(9)
    train(model2, loader2, probe2, 2)
    restarted = samples_by_step(probe2, transport2)
    assert restarted[10] == again[10] and restarted[11] == again[11]
    assert loader2.exclusions().samples == tuple(sorted(bad))
    probe2.close()
    loader2.close()
