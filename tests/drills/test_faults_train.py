"""Optimizer, numeric and distributed faults acting on a real (tiny) training loop."""

from __future__ import annotations

import math

import pytest
import torch

from supervisor.drills.faults import FaultPlan
from tests.drills.conftest import make_batch, make_model, train_step


def _setup(specs: list[dict], rank: int = 0, seed: int = 0, state_dir: object = None):  # type: ignore[no-untyped-def]
    model = make_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = FaultPlan.from_specs(specs, rank=rank, world_size=2, state_dir=state_dir)  # type: ignore[arg-type]
    plan.install(model)
    return model, opt, plan


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_lr_spike_from_its_step_on_until_a_rollback() -> None:
    _, _, plan = _setup([{"kind": "lr_spike", "step": 10, "factor": 8.0}])
    assert [plan.lr_scale(s) for s in (0, 9, 10, 11, 500)] == [1.0, 1.0, 8.0, 8.0, 8.0]
    assert plan.record(11, {"step": 11, "loss": 1.0, "lr": 1e-3})["lr"] == pytest.approx(8e-3)
    # rolled back to a checkpoint from before the spike: its scheduler state is sound
    assert [plan.lr_scale(s) for s in (5, 10, 11, 600)] == [1.0, 1.0, 1.0, 1.0]
    assert plan.record(11, {"step": 11, "loss": 1.0, "lr": 1e-3})["lr"] == pytest.approx(1e-3)


def test_lr_spike_for_a_number_of_steps() -> None:
    _, _, plan = _setup([{"kind": "lr_spike", "step": 3, "factor": 4.0, "steps": 2}])
    assert [plan.lr_scale(s) for s in range(7)] == [1, 1, 1, 4, 4, 1, 1]


def test_oversized_update_fires_once_and_not_on_replay(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, _, plan = _setup([{"kind": "oversized_update", "step": 4, "factor": 30}], state_dir=tmp_path)
    assert [plan.lr_scale(s) for s in range(7)] == [1, 1, 1, 1, 30, 1, 1]
    assert [plan.lr_scale(s) for s in range(2, 7)] == [1] * 5  # rollback to 2, replay through 4
    _, _, restarted = _setup([{"kind": "oversized_update", "step": 4, "factor": 30}], state_dir=tmp_path)
    assert restarted.lr_scale(4) == 1.0  # a restarted worker sees the marker


def test_oversized_update_moves_parameters_much_further() -> None:
    model, opt, plan = _setup([{"kind": "oversized_update", "step": 20, "factor": 50}])
    deltas = []
    for step in range(21):
        before = _flat(model).clone()
        train_step(model, opt, plan, step, make_batch(step))
        deltas.append(float((_flat(model) - before).norm()))
    assert deltas[20] > 10 * max(deltas[10:20])


def test_overflow_makes_the_loss_nonfinite_once_in_training_only() -> None:
    model, opt, plan = _setup([{"kind": "overflow", "step": 3, "scale": 1e6}])
    losses = [train_step(model, opt, plan, s, make_batch(s)).loss for s in range(3)]
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(make_batch(3)["input_ids"])).all()  # eval forward is untouched
    plan_step = train_step(model, opt, plan, 3, make_batch(3))
    assert all(math.isfinite(v) for v in losses) and not math.isfinite(plan_step.loss)


def test_overflow_picks_named_module_or_fails_with_choices() -> None:
    import pytest

    from supervisor.errors import ConfigError

    with pytest.raises(ConfigError, match="valid: emb, up, down, head"):
        _setup([{"kind": "overflow", "step": 3, "module": "mlp"}])
    model, opt, plan = _setup([{"kind": "overflow", "step": 0, "module": "up"}])
    out = train_step(model, opt, plan, 0, make_batch(0))
    assert not math.isfinite(out.loss)


def test_rank_grad_corruption_makes_one_replica_drift() -> None:
    specs = [
        {"kind": "rank_grad_corruption", "step": 5, "rank": 1, "steps": 2, "mode": "noise", "scale": 5.0}
    ]
    replicas = [_setup(specs, rank=r) for r in (0, 1)]
    for step in range(10):
        for model, opt, plan in replicas:
            train_step(model, opt, plan, step, make_batch(step))
        diff = float((_flat(replicas[0][0]) - _flat(replicas[1][0])).norm())
        assert (diff == 0.0) == (step < 5), (step, diff)


def test_resume_without_optimizer_drops_adam_state_and_marks_resumed() -> None:
    model, opt, plan = _setup([{"kind": "resume_without_optimizer", "step": 6}])
    records = [train_step(model, opt, plan, s, make_batch(s)).record for s in range(8)]
    steps = {float(state["step"]) for state in opt.state.values()}
    assert steps == {2.0}  # AdamW restarted its count at step 6: two steps since (6, 7) instead of 8
    assert [r["events"] for r in records] == [[]] * 6 + [["resumed"], []]


def test_scaled_lr_leaves_the_scheduler_in_charge() -> None:
    model, opt, plan = _setup([{"kind": "oversized_update", "step": 2, "factor": 10}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: (i + 1) / 10)
    used = []
    for step in range(1, 5):
        model(torch.zeros(1, 3, dtype=torch.long)).sum().backward()
        with plan.optimizer_step(step, model, opt):
            lr_before = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
        used.append(lr_before)
        opt.zero_grad()
    # the scheduled LRs 1e-3, 2e-3, 3e-3, 4e-3 are untouched by the fault (it acts inside opt.step only)
    assert used == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3])
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-3)


def test_oversized_update_uses_the_scaled_lr_inside_the_step_and_logs_it() -> None:
    model, opt, plan = _setup([{"kind": "oversized_update", "step": 3, "factor": 10}])
    seen = []
    opt.register_step_post_hook(lambda o, a, k: seen.append(o.param_groups[0]["lr"]))
    for step in range(1, 5):
        model(torch.zeros(1, 3, dtype=torch.long)).sum().backward()
        with plan.optimizer_step(step, model, opt):
            opt.step()
        opt.zero_grad()
    assert seen == pytest.approx([1e-2, 1e-2, 1e-1, 1e-2])
    assert plan.record(3, {"step": 3, "loss": 1.0, "lr": 1e-2})["lr"] == pytest.approx(1e-1)
    assert plan.record(4, {"step": 4, "loss": 1.0, "lr": 1e-2})["lr"] == pytest.approx(1e-2)


def test_every_rank_fires_its_own_copy_with_shared_markers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = [{"kind": "oversized_update", "step": 2, "factor": 5}]
    plans = [FaultPlan.from_specs(spec, rank=r, world_size=2, state_dir=tmp_path) for r in (0, 1)]
    assert [p.lr_scale(2) for p in plans] == [5.0, 5.0]
    assert len(list(tmp_path.iterdir())) == 2


def test_flipped_gradients_make_one_replica_climb() -> None:
    specs = [{"kind": "rank_grad_corruption", "step": 40, "rank": 1, "steps": 10}]
    replicas = [_setup(specs, rank=r) for r in (0, 1)]
    losses: dict[int, list[float]] = {0: [], 1: []}
    for step in range(55):
        for rank, (model, opt, plan) in enumerate(replicas):
            losses[rank].append(train_step(model, opt, plan, step, make_batch(step)).loss)
    assert losses[0][:41] == losses[1][:41]
    assert losses[1][50] > losses[1][40] + 0.5 and losses[0][50] < losses[0][40]
