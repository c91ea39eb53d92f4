"""The labelled corpus (real tinylm runs with injected faults): the engine meets its targets.

Targets (issue 4): every harmful fault detected with onset within 2 steps, zero incidents on
clean and benign runs, phenotype right >= 90%, top cause right >= 80%; from the loss alone
(issue 19): >= 90% of the faults the loss shows, no false alarm of severity medium or more.

Here on every trace of up to 300 steps: each phenotype, cause and model size, ~3 s of CPU. The
3,000-step runs are scored by ``python -m bench.detection.score`` (its table is in bench/README.md)
and, in other units, by test_detect_invariance.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCORE = ROOT / "bench" / "detection" / "score.py"
LABELS = json.loads((ROOT / "bench" / "detection" / "corpus" / "labels.json").read_text())
SLICE = sorted(k for k, v in LABELS.items() if v.get("steps", 300) <= 300)


def _score_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("detection_score", SCORE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def score() -> ModuleType:
    return _score_module()


@pytest.fixture(scope="module")
def summary(score: ModuleType) -> dict[str, Any]:
    return dict(score.summarize(score.evaluate(score.CORPUS, "full", SLICE)))


def test_the_slice_covers_every_phenotype_cause_and_size() -> None:
    harmful = [LABELS[k] for k in SLICE if LABELS[k]["harmful"]]
    assert {v["phenotype"] for v in harmful} == {"transient", "slow_recovery", "divergence", "periodic"}
    assert {v["cause"] for v in harmful} == {
        "data", "optimizer", "numeric", "distributed", "resume_state", "metric_artifact"
    }  # fmt: skip
    assert {LABELS[k]["size"] for k in SLICE} == {v["size"] for v in LABELS.values()}
    assert sum(not LABELS[k]["harmful"] for k in SLICE) >= 4  # clean seeds, sizes + the benign shift
    assert {v["steps"] for v in LABELS.values()} > {300}  # the long runs exist (scored by the bench)


def test_engine_meets_the_targets(summary: dict[str, Any]) -> None:
    e = summary["engine"]
    assert e["detected"] == 1.0
    assert e["false_alarms"] == 0
    assert e["phenotype"] >= 0.9
    assert e["cause"] >= 0.8


def test_engine_beats_every_baseline_on_detection(summary: dict[str, Any]) -> None:
    for name in ("killspike", "6sigma", "10x_early"):
        assert summary["engine"]["detected"] > summary[name]["detected"], name


def test_loss_only_copies_keep_what_the_loss_shows(score: ModuleType) -> None:
    e = score.summarize(score.evaluate(score.CORPUS, "loss_only", SLICE), "loss_only")["engine"]
    assert e["detected_visible"] >= 0.9
    assert e["medium_plus_false_alarms"] == 0
