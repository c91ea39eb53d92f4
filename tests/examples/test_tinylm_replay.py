"""The replay action on the example job: a batch of garbage reproduces from a healthy
checkpoint (cause: data); a batch of ordinary samples does not."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from examples.tinylm.replay import replay_hooks
from supervisor.checkpoint.store import CheckpointStore
from supervisor.checkpoint.training_state import save_training_state
from supervisor.config.job import JobSpec
from supervisor.ranks.replay import run_replay
from supervisor.storage import open_backend

pytestmark = pytest.mark.slow

_rng = random.Random(7)
# Binary-looking junk (multi-byte UTF-8 the text never contains), as a corrupt shard would hold.
JUNK = "".join(chr(_rng.randrange(0x400, 0x7FF)) for _ in range(2048))
CONFIG: dict[str, Any] = {
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2},
    "data": {"max_bytes_per_source": 60_000, "extra_texts": {"junk": {"junk.bin": JUNK}}},
    "max_steps": 60,
    "lr": 2e-2,
}


@pytest.fixture(scope="module")
def trained_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[str], list[str]]:
    """A job whose checkpoint at step 60 was trained on text only (the junk source held out)."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("store")
    hooks = replay_hooks(CONFIG)
    ds = hooks.dataset
    text_ids = [ds.sample_id(i) for i in range(len(ds)) if ds.source(i) != "junk"]
    junk_ids = [ds.sample_id(i) for i in range(len(ds)) if ds.source(i) == "junk"]
    order = random.Random(0).sample(text_ids, len(text_ids))
    for step in range(150):
        batch = hooks.batch(order[(step * 8) % len(order) :][:8])
        hooks.optimizer.zero_grad()
        hooks.loss(hooks.model, batch).backward()
        hooks.optimizer.step()
    job = JobSpec.model_validate(
        {"name": "replay", "entrypoint": "examples.tinylm.train:main", "config": CONFIG,
         "storage": {"path": str(root)}, "max_steps": 60}
    )  # fmt: skip
    store = CheckpointStore(open_backend(str(root)), job.name)
    save_training_state(store, 60, rank=0, world_size=1, model=hooks.model, optimizer=hooks.optimizer)
    return job.model_dump(), junk_ids[:4], order[-4:]


def test_garbage_batch_reproduces_as_data(trained_job: tuple[dict[str, Any], list[str], list[str]]) -> None:
    job, junk, _ = trained_job
    out = run_replay(job, 60, junk, numeric=True)
    assert out["verdict"] == "data", out
    assert out["suspect"]["loss"] > 1.5 * out["control"]["loss"]
    assert not set(out["control_samples"]) & set(junk)
    assert "suspect_fp32_math" in out


def test_ordinary_batch_does_not_reproduce(trained_job: tuple[dict[str, Any], list[str], list[str]]) -> None:
    job, _, normal = trained_job
    out = run_replay(job, 60, normal, numeric=False)
    assert out["verdict"] == "transient_or_system", out


def test_unknown_sample_is_an_error_not_a_smaller_batch(
    trained_job: tuple[dict[str, Any], list[str], list[str]],
) -> None:
    hooks = replay_hooks(CONFIG)
    with pytest.raises(KeyError, match="not in the dataset"):
        hooks.batch(["code:nope.py:0"])


def test_module_exposes_the_hook_through_the_entrypoint(tmp_path: Path) -> None:
    import examples.tinylm.train as entry

    assert entry.replay_hooks is replay_hooks
