"""The scenario sampler's space (bench/sampler/space.py): seeded draws, coverage, reproduction commands.

Pure Python (no Ray, no torch training): what a failing cell prints must run the same cell again.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import fields
from pathlib import Path

import pytest

from bench.sampler import space
from bench.sampler.run import Result, final_loss, job_dict, judge
from bench.sampler.run import main as sampler_main


def test_draws_are_deterministic_per_seed_and_differ_across_seeds() -> None:
    a = space.draw(123, 20, 5)
    assert a == space.draw(123, 20, 5)
    assert a != space.draw(124, 20, 5)
    clean, faulty = a
    assert len(clean) == 5 and len(faulty) == 20
    # Every fault cell runs on one of the clean bases: its reference is that clean run.
    assert {c.base for c in faulty} <= {c.base for c in clean}
    assert all(c.fault is None for c in clean) and all(c.fault is not None for c in faulty)


def test_every_dimension_is_covered_over_many_seeds() -> None:
    seen: dict[str, set[object]] = {name: set() for name in
                                    ("family", "optimizer", "schedule", "accumulation", "precision", "ranks",
                                     "kind", "moment")}  # fmt: skip
    for seed in range(60):
        _clean, faulty = space.draw(seed, 20, 5)
        for cell in faulty:
            assert cell.fault is not None
            for name in ("family", "optimizer", "schedule", "accumulation", "precision", "ranks"):
                seen[name].add(getattr(cell.base, name))
            seen["kind"].add(cell.fault.kind)
            seen["moment"].add(cell.fault.moment)
    assert seen["family"] == set(space.FAMILIES) and len(space.FAMILIES) >= 6
    assert seen["optimizer"] == {"adamw", "sgd", "lion"}
    assert seen["schedule"] == {*space.SCHEDULES, *space.SCHEDULE_VARIANTS}
    from bench.sampler.optim import schedule

    for name in seen["schedule"]:  # the job knows every schedule drawn
        assert [schedule(str(name), 150, 15)(s) for s in (0, 80, 149)]
    assert seen["accumulation"] == {1, 2, 3, 4}
    assert seen["precision"] == {"fp32", "bf16", "fp16"}
    assert seen["ranks"] == {2, 3, 4}
    assert seen["kind"] == set(space.FAULTS) and len(space.FAULTS) == 12
    assert seen["moment"] == set(space.MOMENTS)


@pytest.mark.parametrize("max_steps", [space.MIN_STEPS, 60, 99, space.MAX_STEPS, 401])
@pytest.mark.parametrize("moment", space.MOMENTS)
def test_onsets_fall_in_their_moment(moment: str, max_steps: int) -> None:
    import random

    rng = random.Random(f"{moment}:{max_steps}")
    for _ in range(200):
        step = space.onset(moment, rng, max_steps)
        if moment == "warmup":  # after the first few steps, inside the warm-up
            assert 4 <= step < space.WARMUP_STEPS
        elif moment == "after_checkpoint":
            assert step % space.CHECKPOINT_EVERY in (1, 2) and step >= 2 * space.CHECKPOINT_EVERY
            assert step < max_steps * 95 // 100
        elif moment == "mid_run":  # the middle third
            assert max_steps // 3 <= step <= 2 * max_steps // 3
        else:  # the last 5%, before the very last step
            assert max_steps * 95 // 100 <= step < max_steps


@pytest.mark.parametrize("moment", space.MOMENTS)
def test_a_run_too_short_for_the_moments_is_refused(moment: str) -> None:
    import random

    with pytest.raises(ValueError, match=f"at least {space.MIN_STEPS}"):
        space.onset(moment, random.Random(0), space.MIN_STEPS - 1)


def test_recurring_shard_recurs_with_one_occurrence_at_the_moment() -> None:
    for seed in range(400):
        base = space.draw_base(seed)
        f = space.draw_fault(seed, base)
        if f.kind != "recurring_shard":
            continue
        occurrences = range(f.step, base.max_steps + 1, f.period)
        assert f.period >= 40 and len(occurrences) >= 2
        assert 0 <= f.rank < base.ranks


def test_the_new_kinds_draw_what_their_faults_need() -> None:
    seen: dict[str, set[object]] = {"logging_bug": set(), "mixture_shift": set(), "worker_kill": set(),
                                     "logging_then_lr": set()}  # fmt: skip
    for seed in range(600):
        base = space.draw_base(seed)
        f = space.draw_fault(seed, base)
        if f.kind == "logging_bug":
            assert f.mode in ("misreduced", "padding") and 1 <= f.span <= base.max_steps - f.step + 1
            seen[f.kind].add((f.mode, f.span == base.max_steps - f.step + 1))
        elif f.kind == "mixture_shift":
            weights = dict(f.weights)
            assert set(weights) == set(space.SOURCES) and sorted(weights.values())[-1] == 1.0
            assert sum(w == 1.0 for w in weights.values()) == 1  # one source leads
            seen[f.kind].add(max(weights, key=weights.__getitem__))
        elif f.kind == "worker_kill":
            assert 0 <= f.rank < base.ranks
            if f.corrupt_step:  # the newest checkpoint saved before the kill
                assert f.corrupt_step % base.checkpoint_every == 0
                assert 0 < f.step - f.corrupt_step <= base.checkpoint_every
            seen[f.kind].add(bool(f.corrupt_step))
        elif f.kind == "logging_then_lr":
            assert 2 <= f.logged_from < f.step <= base.max_steps - 20 and f.factor >= 20
            seen[f.kind].add(f.mode)
    assert seen["logging_bug"] == {(m, e) for m in ("misreduced", "padding") for e in (False, True)}
    assert seen["mixture_shift"] == set(space.SOURCES)
    assert seen["worker_kill"] == {False, True}
    assert seen["logging_then_lr"] == {"misreduced", "padding"}


def test_run_length_and_checkpoint_interval_are_drawn_and_every_moment_fits() -> None:
    import random

    seen = set()
    for seed in range(3000):
        base = space.draw_base(seed)
        seen.add((base.max_steps, base.checkpoint_every))
        assert base.max_steps >= space.min_steps(base.checkpoint_every)
        f = space.draw_fault(seed, base)
        assert 4 <= f.step < base.max_steps
        if f.moment == "after_checkpoint" and f.kind != "recurring_shard":  # that one: its first occurrence
            # After the second checkpoint at least: the one before the onset is too close to be healthy,
            # so a rollback needs the one before it (the run's start is no target past the first).
            assert f.step % base.checkpoint_every in (1, 2) and f.step > 2 * base.checkpoint_every, (seed, f)
    assert seen == {(n, c) for n in space.RUN_LENGTHS for c in space.CHECKPOINT_INTERVALS}
    for every in space.CHECKPOINT_INTERVALS:  # the shortest run allowed still fits each moment
        rng = random.Random(every)
        for moment in space.MOMENTS:
            assert 4 <= space.onset(moment, rng, space.min_steps(every), every) < space.min_steps(every)


def test_a_base_seed_draws_the_base_it_drew_before_run_length_and_interval_were_drawn() -> None:
    # Named in bench/sampler/README.md's results: llama, Lion, inv_sqrt, accumulation 2, fp32, 2 ranks.
    b = space.draw_base(269429)
    assert (b.family, b.optimizer, b.schedule, b.accumulation, b.precision, b.ranks) == (
        "llama", "lion", "inv_sqrt", 2, "fp32", 2)  # fmt: skip


def test_a_failing_cells_command_reproduces_the_same_cell() -> None:
    _clean, faulty = space.draw(99, 12, 3, load="busy")
    for cell in faulty:
        argv = shlex.split(cell.command())
        assert argv[:3] == ["python", "-m", "bench.sampler"]
        cell_id = argv[argv.index("--cell") + 1]
        again = space.cell_from_id(cell_id, "busy" if "--busy" in argv else "idle")
        assert again == cell
        assert job_dict(again, Path("/s")) == job_dict(cell, Path("/s"))


def test_bad_cell_ids_and_sizes_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert sampler_main(["--cell", "12:x"]) == 2
    assert sampler_main(["--cells", "3", "--clean", "0", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_last_line_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        space.summary_line(19, 20, 5, 5, 4242)
        == "sampler: 19/20 fault cells passed, 5/5 clean cells clean, seed 4242"
    )
    assert sampler_main(["--seed", "4242", "--cells", "4", "--clean", "2", "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "sampler: 0/4 fault cells passed, 0/2 clean cells clean, seed 4242"
    assert len(lines) == 1 + 6 + 1  # header, one line per cell, the last line


def test_every_fault_becomes_a_valid_job() -> None:
    from supervisor.config.job import JobSpec
    from supervisor.drills.specs import parse_faults

    kinds = set()
    for seed in range(30):
        clean, faulty = space.draw(seed, 8, 2)
        for cell in [*clean, *faulty]:
            job = JobSpec.model_validate(job_dict(cell, Path("/tmp/sampler-test")))
            parse_faults(job.faults)
            assert job.resources.num_workers == cell.base.ranks
            kinds.add(cell.fault.kind if cell.fault else "clean")
    assert kinds == {"clean", *space.FAULTS}


def _rec(step: int, rank: int, loss: float, web: float | None = None) -> dict[str, object]:
    rec: dict[str, object] = {"step": step, "rank": rank, "loss": loss, "loss_sum": loss * 100, "tokens": 100}
    if web is not None:
        rec["sources"] = {
            "code": {"tokens": 50, "loss_sum": loss * 50},
            "web": {"tokens": 50, "loss_sum": web * 50},
        }
    return rec


def test_final_loss_is_a_robust_median_of_the_timeline_that_finished() -> None:
    records = [_rec(s, r, 9.0) for s in range(1, 151) for r in range(2)]  # a first timeline
    records += [
        _rec(s, r, 2.0) for s in range(100, 151) for r in range(2)
    ]  # rolled back: the one that finished
    records.append(_rec(150, 1, 7.0))  # one garbage batch at the last step does not stand for the model
    assert final_loss(records, 2, 150) == pytest.approx(2.0)
    assert final_loss([_rec(s, 0, 2.0) for s in range(145, 151)], 1, 150) is None  # too few steps
    with_web = [_rec(s, r, 2.0, web=8.0) for s in range(141, 151) for r in range(2)]
    assert final_loss(with_web, 2, 150, without="web") == pytest.approx(2.0)


def test_judge_applies_the_criteria() -> None:
    def res(**kw: object) -> Result:
        base = {
            "id": "1:2",
            "name": "n",
            "clean": False,
            "fault": "garbage_rank",
            "command": "c",
            "phase": "finished",
        }
        r = Result(**{**base, **kw})  # type: ignore[arg-type]
        return r

    ok = res(final_loss=1.04, reference_loss=1.0)
    judge(ok, escalates=False)
    assert ok.ok
    worse = res(final_loss=1.06, reference_loss=1.0)
    judge(worse, escalates=False)
    assert not worse.ok
    escalated = res(phase="escalated", reason="x", final_loss=1.0, reference_loss=1.0)
    judge(escalated, escalates=False)
    assert not escalated.ok  # nothing but the persistent LR bug may escalate
    persistent = res(
        fault="lr_persistent", phase="escalated", incidents=[{"rules": ["a", "b"], "escalation": "why"}]
    )
    judge(persistent, escalates=True)
    assert persistent.ok and "why" in persistent.verdict
    silent = res(fault="lr_persistent", phase="escalated", reason="")
    judge(silent, escalates=True)
    assert not silent.ok  # an escalation must say why
    clean = res(
        clean=True, fault="clean", incidents=[{"severity": "medium", "phenotype": "p", "top_cause": "c"}]
    )
    judge(clean, escalates=False)
    assert not clean.ok
    low = res(clean=True, fault="clean", incidents=[{"severity": "low"}])
    judge(low, escalates=False)
    assert low.ok
    unseen = res(fault="bad_source", final_loss=1.0, reference_loss=1.0, incidents=[])
    judge(unseen, escalates=False)
    assert not unseen.ok  # finishing near the clean loss without keeping the source out proves nothing
    assert {f.name for f in fields(Result)} >= {"id", "command", "verdict", "ok"}


def test_judge_of_benign_faults_and_a_killed_worker() -> None:
    def res(fault: str, **kw: object) -> Result:
        r = Result(**{"id": "1:2", "name": "n", "clean": False, "fault": fault, "command": "c",
                      "phase": "finished", "final_loss": 1.0, "reference_loss": 1.0, **kw})  # type: ignore[arg-type]  # fmt: skip
        judge(r, escalates=False)
        return r

    metric = {
        "severity": "medium",
        "top_cause": "metric_artifact",
        "rules": ["metric_artifact"],
        "rollbacks": 0,
    }
    assert res("logging_bug", incidents=[metric]).ok
    assert res("logging_bug", incidents=[]).ok  # nothing done: no harm
    assert not res("logging_bug", incidents=[{**metric, "top_cause": "data"}]).ok  # blamed the data
    assert not res("logging_bug", incidents=[{**metric, "rollbacks": 1}]).ok  # rolled back sound training
    assert not res("logging_bug", final_loss=1.2, incidents=[]).ok
    # A mixture shift changes the data: no loss reference, but nothing may be done about it.
    assert res("mixture_shift", final_loss=1.3, incidents=[{"severity": "low", "top_cause": "data"}]).ok
    assert not res("mixture_shift", incidents=[{"severity": "low", "excluded_sources": ["web"]}]).ok
    assert not res("mixture_shift", incidents=[{"severity": "medium", "top_cause": "data"}]).ok
    killed = {"severity": "high", "top_cause": "distributed", "first_rank": 1}
    assert res("worker_kill", rank=1, incidents=[killed]).ok
    assert not res("worker_kill", rank=0, incidents=[killed]).ok  # another rank named
    assert res("worker_kill", rank=1, corrupted=100, resumed_from=80, incidents=[killed]).ok
    assert not res("worker_kill", rank=1, corrupted=100, resumed_from=100, incidents=[killed]).ok
    assert not res("worker_kill", rank=1, corrupted=100, resumed_from=None, incidents=[killed]).ok
    # A lasting logging error, then an LR raised until a rollback: the loss alone proves nothing.
    logged = {"severity": "low", "top_cause": "metric_artifact", "rollbacks": 0}
    rolled = {"severity": "high", "top_cause": "optimizer", "rollbacks": 1}
    assert res("logging_then_lr", incidents=[logged, rolled]).ok
    assert not res("logging_then_lr", incidents=[logged]).ok  # hidden behind the logging error
    assert not res("logging_then_lr", incidents=[{**logged, "rollbacks": 1}]).ok


def test_rejudge_judges_what_an_interrupted_invocation_finished(tmp_path: Path) -> None:
    from dataclasses import asdict

    from bench.sampler.run import rejudge

    clean, faulty = space.draw(5, 6, 2)
    on_first = [
        c
        for c in faulty
        if c.base == clean[0].base
        and not c.escalates
        and c.fault is not None
        and c.fault.kind not in space.BENIGN
    ]
    on_second = [c for c in faulty if c.base == clean[1].base and not c.escalates]
    assert on_first and on_second

    def result(cell: space.Cell, loss: float) -> Result:
        kind = cell.fault.kind if cell.fault else "clean"
        return Result(cell.id, cell.name, cell.fault is None, kind, cell.command(), phase="finished",
                      final_loss=loss, final_loss_good=loss)  # fmt: skip

    rows = [result(clean[0], 2.0), result(on_first[0], 2.2), result(on_second[0], 2.0)]  # clean[1] never ran
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    clean_res, fault_res = rejudge(tmp_path)
    assert [r.id for r in clean_res] == [clean[0].id] and clean_res[0].ok
    assert [r.id for r in fault_res] == [on_first[0].id]  # no reference for the other: not judged
    assert not fault_res[0].ok and fault_res[0].loss_ratio == pytest.approx(1.1)


def test_planned_lr_jumps_fall_where_their_schedule_puts_them() -> None:
    from bench.sampler.optim import schedule

    decay = [schedule("step_decay", 200, 15)(s) for s in range(200)]
    assert decay[99] == 1.0 and decay[100] == pytest.approx(0.1) and decay[150] == pytest.approx(0.01)
    sgdr = [schedule("cosine_restarts", 200, 15)(s) for s in range(200)]
    restarts = [s for s in range(16, 200) if sgdr[s] > 5 * sgdr[s - 1]]
    assert restarts == [15 + 62, 15 + 124]  # a third of the steps after warm-up each, back at the peak
    assert all(sgdr[s] == 1.0 for s in restarts)
