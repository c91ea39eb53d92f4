"""A supervisor killed at any step restores an analyzer that decides as the one that never stopped:
saved into the real state file (``RuntimeState``) and read back at steps around each fault's onset
-- between the onset and its detection among them -- the run ends with the same incidents (onset,
phenotype, cause, rank, severity, suspect samples). Real telemetry: the labelled corpus's tinylm
runs with injected faults, among them losses that went to Inf and NaN."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.records import Record
from supervisor.runtime.state import BufferJSON, RuntimeState

CORPUS = Path(__file__).resolve().parents[2] / "bench" / "detection" / "corpus"
LABELS = json.loads((CORPUS / "labels.json").read_text())


def steps_of(name: str) -> list[tuple[int, list[Record]]]:
    with gzip.open(CORPUS / f"{name}.jsonl.gz", "rt") as fh:
        return list(group_steps([Record.from_dict(json.loads(line)) for line in fh]))


def through_state_file(analyzer: StreamingAnalyzer, path: Path) -> StreamingAnalyzer:
    """What a restarted supervisor gets back: the state written as the controller writes it."""
    state = RuntimeState(job="restore")
    state.hold_analyzer(analyzer.state_dict(), BufferJSON())
    state.save(path)
    loaded = RuntimeState.load(path)
    assert loaded is not None
    again = StreamingAnalyzer(analyzer.settings)
    again.load_state_dict(loaded.analyzer)
    return again


def outcome(steps: list[tuple[int, list[Record]]], path: Path, restart_at: int | None = None) -> list[Any]:
    analyzer = StreamingAnalyzer()
    for step, records in steps:
        analyzer.observe_step(step, records)
        if step == restart_at:
            analyzer = through_state_file(analyzer, path)
    return [
        (d.onset_step, d.phenotype, d.top_cause, d.first_rank, d.severity, d.suspect_samples)
        for d in analyzer.finish().incidents
    ]


@pytest.mark.parametrize("name", ["lr_too_high_small", "bad_source", "fp16_overflow"])
def test_an_analyzer_restored_from_its_state_file_decides_as_one_that_never_stopped(
    tmp_path: Path, name: str
) -> None:
    steps = steps_of(name)
    straight = outcome(steps, tmp_path / "state.json")
    onset = LABELS[name]["onset"]
    assert straight and abs(straight[0][0] - onset) <= 1  # the fault is found and dated
    for at in (onset - 1, onset, onset + 1, onset + 2, onset + 4, onset + 12):
        assert outcome(steps, tmp_path / "state.json", restart_at=at) == straight, (
            f"restarted after step {at}"
        )


def test_nan_and_inf_survive_the_state_file(tmp_path: Path) -> None:
    state = RuntimeState(job="restore")
    state.hold_analyzer({"peak": float("inf"), "loss": [(3, float("nan")), (4, -float("inf"))]}, BufferJSON())
    state.save(tmp_path / "state.json")
    loaded = RuntimeState.load(tmp_path / "state.json")
    assert loaded is not None
    peak, [(s3, nan), (s4, ninf)] = loaded.analyzer["peak"], loaded.analyzer["loss"]
    assert peak == float("inf") and (s3, s4) == (3, 4) and nan != nan and ninf == -float("inf")


SHORT = sorted(k for k, v in LABELS.items() if v.get("steps", 300) <= 300)


@pytest.mark.slow
def test_every_short_corpus_trace_decides_the_same_restored_at_any_of_its_steps(tmp_path: Path) -> None:
    """Each trace of up to 300 steps, clean and benign ones too: restored every 23rd step from the
    first baselines on, and at each step from just before a fault's onset to after its detection."""
    for name in SHORT:
        steps = steps_of(name)
        straight = outcome(steps, tmp_path / "state.json")
        at = set(range(40, len(steps), 23))
        if LABELS[name]["harmful"]:
            onset = LABELS[name]["onset"]
            at |= set(range(onset - 1, onset + 6))
        for step in sorted(at):
            assert outcome(steps, tmp_path / "state.json", restart_at=step) == straight, (
                f"{name}: after {step}"
            )
