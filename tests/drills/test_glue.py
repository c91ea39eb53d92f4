"""Plan wiring: records through the transport, a real checkpoint corrupted through its store, the mixture dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from supervisor.checkpoint import CheckpointStore, verify
from supervisor.checkpoint.training_state import save_training_state
from supervisor.drills.base import Markers
from supervisor.drills.faults import FaultPlan
from supervisor.drills.glue import FaultTransport, MixtureDataset, plan_dataset
from supervisor.storage import open_backend
from tests.drills.conftest import make_model


class ListTransport:
    """The SDK Transport protocol over a list (the real ones batch to Ray or a file)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.stats = "inner-stats"

    def send(self, batch: list[dict[str, Any]]) -> None:
        self.sent.extend(batch)

    def poll(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def test_transport_applies_logging_bug_and_leaves_control_messages() -> None:
    plan = FaultPlan.from_specs([{"kind": "logging_bug", "step": 5, "steps": 1}], rank=0, world_size=2)
    inner = ListTransport()
    t = FaultTransport(inner, plan)
    t.send(
        [{"step": 4, "loss": 1.0}, {"step": 5, "loss": 1.0}, {"step": 5, "control": True, "events": ["x"]}]
    )
    assert [r.get("loss") for r in inner.sent] == [1.0, 2.0, None]
    assert t.stats == "inner-stats"


def test_late_records_do_not_close_one_off_windows() -> None:
    # The record of step s leaves during step s + 1: it must not read as a rollback.
    plan = FaultPlan.from_specs([{"kind": "oversized_update", "step": 6, "factor": 9}], rank=0, world_size=1)
    t = FaultTransport(ListTransport(), plan)
    assert plan.lr_scale(5) == 1.0
    t.send([{"step": 4, "loss": 1.0}])
    assert plan.lr_scale(6) == 9.0


def test_corrupt_checkpoint_through_the_store_fails_verification(tmp_path: Path) -> None:
    store = CheckpointStore(open_backend(str(tmp_path)), "job")
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    markers = Markers(store.backend, "job/faults")
    plan = FaultPlan.from_specs(
        [{"kind": "corrupt_checkpoint", "step": 20}], rank=0, world_size=1, state_dir=markers
    )
    t = FaultTransport(ListTransport(), plan, store)
    for step in (10, 20, 30):
        save_training_state(store, step, rank=0, world_size=1, model=model, optimizer=opt)
        t.send([{"step": step, "loss": 1.0, "events": ["checkpoint_saved"]}])
    assert [verify(store, s).ok for s in (10, 20, 30)] == [True, False, True]
    assert any("checksum" in p for p in verify(store, 20).problems)
    assert (tmp_path / "job" / "faults").is_dir()  # the marker lives in the job's storage


class SourcedData:
    def __init__(self) -> None:
        self.items = [("code" if i < 60 else "tests", i) for i in range(100)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> int:
        return self.items[i][1]

    def source(self, i: int) -> str:
        return self.items[i][0]

    def sample_id(self, i: int) -> str:
        return f"{self.items[i][0]}:{i}"


def test_mixture_dataset_switches_sources_at_its_step() -> None:
    plan = FaultPlan.from_specs(
        [{"kind": "mixture_shift", "step": 10, "weights": {"tests": 1.0}}], rank=0, world_size=1
    )
    ds = plan_dataset(plan, SourcedData())
    assert isinstance(ds, MixtureDataset)
    step = [5]
    plan.step_fn = lambda: step[0]
    before = [ds.source(i) for i in range(100)]
    assert before.count("code") == 60 and ds[3] == 3
    step[0] = 10
    after = [ds.source(i) for i in range(100)]
    assert after == ["tests"] * 100
    assert all(ds.sample_id(i).startswith("tests:") and ds[i] >= 60 for i in range(100))
    assert [ds[i] for i in range(100)] == [ds[i] for i in range(100)]  # deterministic


def test_mixture_weights_are_followed() -> None:
    spec = {"kind": "mixture_shift", "step": 0, "weights": {"tests": 0.75, "code": 0.25}}
    ds = plan_dataset(FaultPlan.from_specs([spec], rank=0, world_size=1), SourcedData())
    share = [ds.source(i) for i in range(100)].count("tests") / 100
    assert 0.6 < share < 0.9


def test_replay_rebuilds_the_garbage_training_was_fed(tmp_path: Path) -> None:
    from supervisor.config.job import JobSpec
    from supervisor.drills.glue import replay_view
    from tests.drills.conftest import make_batch

    job = JobSpec.model_validate({"name": "j", "entrypoint": "a.b:c", "storage": {"path": str(tmp_path)}, "max_steps": 9,
                                  "faults": [{"kind": "garbage_batch", "step": 3, "rank": 1, "fraction": 0.5}]})  # fmt: skip
    markers = Markers(open_backend(str(tmp_path)), "j/faults")
    plan = FaultPlan.from_specs(job.faults, rank=1, world_size=2, state_dir=markers, vocab_size=40)
    fed = plan.batch(3, make_batch(3))

    class Hooks:  # what an entrypoint's replay_hooks(config) returns: batches rebuilt by sample ID
        model = "the model"

        def batch(self, ids: list[str]) -> dict[str, Any]:
            clean = make_batch(3)
            rows = [clean["sample_ids"].index(i) for i in ids]
            return {
                k: (v[rows] if isinstance(v, torch.Tensor) else [v[r] for r in rows])
                for k, v in clean.items()
            }

    view = replay_view(Hooks(), job)
    assert view.model == "the model"
    suspects = fed["sample_ids"][:2]
    replayed = view.batch(suspects)
    assert torch.equal(replayed["input_ids"], fed["input_ids"][:2])  # the same garbage
    control = view.batch(fed["sample_ids"][2:])
    assert torch.equal(control["input_ids"], make_batch(3)["input_ids"][2:])  # clean samples stay clean
    restarted = FaultPlan.from_specs(job.faults, rank=1, world_size=2, state_dir=markers, vocab_size=40)
    again = restarted.batch(7, make_batch(3))  # the same samples, drawn again by a restarted worker
    assert torch.equal(again["input_ids"], fed["input_ids"])
