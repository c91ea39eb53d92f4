"""What the incident flow tells the detector about its own fix: the override's parameters, its
precision change and the observation window the plan watches (``IncidentFlow.note_overrides``),
so the detector's own window covers the same steps as the plan's ``observe``."""

from __future__ import annotations

from types import SimpleNamespace

from supervisor.core.analysis import StreamingAnalyzer
from supervisor.runtime.incidents import IncidentFlow


def _flow(actions: list[tuple[str, dict[str, object]]]) -> tuple[IncidentFlow, StreamingAnalyzer, list]:
    flow = object.__new__(IncidentFlow)
    analyzer = StreamingAnalyzer()
    anchored: list[tuple[int, tuple[str, ...]]] = []
    real = analyzer.detector.reanchor

    def spy(step: int, metrics: tuple[str, ...]) -> None:
        anchored.append((step, metrics))
        real(step, metrics)

    analyzer.detector.reanchor = spy  # type: ignore[method-assign]
    plan = SimpleNamespace(actions=tuple(SimpleNamespace(name=n, params=p) for n, p in actions))
    flow.analyzer = analyzer
    flow._out = []
    flow.state = SimpleNamespace(active=SimpleNamespace(plan=plan, index=0))  # type: ignore[assignment]
    return flow, analyzer, anchored


def test_precision_and_the_plans_window_reach_the_detector() -> None:
    flow, analyzer, anchored = _flow([("apply", {"precision": "bf16"}), ("observe", {"steps": 120})])
    flow.note_overrides(200, {"precision": "bf16", "grad_clip": 0.5}, "fix of incident 1")
    [iv] = analyzer.interventions
    assert iv.step == 200 and iv.grad_clip == 0.5
    assert analyzer.observing(200 + 120) and not analyzer.observing(200 + 121)
    assert any(step == 200 and "loss" in m for step, m in anchored), anchored  # other rounding


def test_without_an_observe_in_the_plan_the_detectors_default_window_holds() -> None:
    flow, analyzer, anchored = _flow([("apply", {"grad_clip": 0.5})])
    flow.note_overrides(100, {"grad_clip": 0.5}, "fix of incident 1")
    n = 2 * analyzer.settings.level_window
    assert analyzer.observing(100 + n) and not analyzer.observing(100 + n + 1)
    assert not any("loss" in m for _, m in anchored)
