"""Whether a resume restored every state component is checked where the state is loaded, not
inferred from an Adam-shaped update jump (issue 24 point 4): a sign-based optimizer's update never
changes size, so only the check can see its lost moments."""

from __future__ import annotations

import torch

from supervisor.checkpoint.consistency import summarize
from supervisor.checkpoint.training_state import incomplete_components, resume_check
from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.traces.synthetic import synthetic_records
from tests.core.optim_dynamics import Run


def _trained(name: str) -> tuple[Run, torch.optim.lr_scheduler.LambdaLR]:
    run = Run(name, seed=0)
    sched = torch.optim.lr_scheduler.LambdaLR(run.opt, lambda s: 1.0)
    for _ in range(5):
        run.train()
        sched.step()
    return run, sched


def test_a_resume_that_drops_the_optimizer_scheduler_and_cursor_is_reported_per_component() -> None:
    for name in ("adamw", "sgd", "lion"):
        run, sched = _trained(name)
        saved = summarize(run.opt, sched, {"cursor": 40})
        assert resume_check(saved, optimizer=run.opt, scheduler=sched, data_state={"cursor": 40}) == []
        fresh = type(run.opt)(run.model.parameters(), lr=run.base_lr)  # the script forgot to load it
        fresh_sched = torch.optim.lr_scheduler.LambdaLR(fresh, lambda s: 1.0)
        events = resume_check(saved, optimizer=fresh, scheduler=fresh_sched, data_state={"cursor": 0})
        assert events == [
            "resume_incomplete:loader",
            "resume_incomplete:optimizer",
            "resume_incomplete:scheduler",
        ], (
            name,
            events,
        )


def test_report_lines_map_to_components_and_intended_changes_do_not() -> None:
    report = [
        "world_size changed: checkpoint 4, now 2",
        "global_batch_size changed: checkpoint 8, now 16",
        "optimizer moment 'exp_avg': 4 non-zero tensors saved, 0 restored",
        "checkpoint has no scaler state: the scaler starts fresh",
    ]
    assert incomplete_components(report) == ["optimizer", "scaler"]
    assert incomplete_components(report[:2]) == []


def test_the_detector_opens_resume_state_on_the_event_alone() -> None:
    a = StreamingAnalyzer()
    for step, batch in group_steps(synthetic_records(220, 2, seed=1)):
        if step == 200:
            for r in batch:
                r.events = ["resumed", "resume_incomplete:optimizer"]
        a.observe_step(step, batch)
    (d,) = a.finish().incidents
    assert d.onset_step == 200 and d.after_resume and d.top_cause is not None
    assert d.top_cause.value == "resume_state" and d.severity.value == "high"
