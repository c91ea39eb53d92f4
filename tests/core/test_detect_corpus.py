"""The labelled corpus (real tinylm runs with injected faults): the engine meets its targets.

Targets (issue 4): every harmful fault detected with onset within 2 steps, zero incidents on
clean and benign runs, phenotype right >= 90%, top cause right >= 80%.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCORE = ROOT / "bench" / "detection" / "score.py"


def _score_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("detection_score", SCORE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def summary() -> dict:  # type: ignore[type-arg]
    score = _score_module()
    rows = score.evaluate(score.CORPUS)
    assert len(rows) >= 13
    return score.summarize(rows)


def test_corpus_covers_every_phenotype_and_cause() -> None:
    import json

    labels = json.loads((ROOT / "bench" / "detection" / "corpus" / "labels.json").read_text())
    harmful = [v for v in labels.values() if v["harmful"]]
    assert {v["phenotype"] for v in harmful} == {"transient", "slow_recovery", "divergence", "periodic"}
    assert {v["cause"] for v in harmful} == {
        "data", "optimizer", "numeric", "distributed", "resume_state", "metric_artifact"
    }  # fmt: skip
    assert sum(not v["harmful"] for v in labels.values()) >= 4  # clean seeds + the benign shift


def test_engine_meets_the_targets(summary: dict) -> None:  # type: ignore[type-arg]
    e = summary["engine"]
    assert e["detected"] == 1.0
    assert e["false_alarms"] == 0
    assert e["phenotype"] >= 0.9
    assert e["cause"] >= 0.8


def test_engine_beats_every_baseline_on_detection(summary: dict) -> None:  # type: ignore[type-arg]
    for name in ("killspike", "6sigma", "10x_early"):
        assert summary["engine"]["detected"] > summary[name]["detected"], name
