"""A garbage batch on one of two ranks is found from the split between the ranks at that step,
without waiting for the gradients to co-move (issue 13: at step 80 of a young run a whole garbage
batch on rank 1, 2x the other rank's loss with the grad norm 1.7x, opened nothing).

Real 2-rank telemetry: ranks 0 and 1 of the corpus's clean tinylm runs (each rank's batch is
drawn alike, so two of four ranks are a 2-rank run), with one rank's batch made garbage."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from supervisor.core.analysis import analyze_records
from supervisor.core.model import Severity
from supervisor.core.records import Record
from supervisor.traces import read_trace
from supervisor.traces.synthetic import at, set_loss, synthetic_records
from tests.core.test_detect_invariance import CORPUS


@functools.cache
def _two_ranks(name: str) -> tuple[Record, ...]:
    recs = [r for r in read_trace(CORPUS / f"{name}.jsonl.gz").records if r.rank < 2]
    for r in recs:
        r.world_size = 2
    return tuple(recs)


def _copy(name: str) -> list[Record]:
    return [dataclasses.replace(r) for r in _two_ranks(name)]


@pytest.mark.parametrize("name", ["clean_s0", "clean_s1", "clean_s2", "clean_small", "clean_narrow"])
def test_two_clean_ranks_raise_nothing(name: str) -> None:
    assert analyze_records(_copy(name)).incidents == []


@pytest.mark.parametrize(("name", "step"), [("clean_s1", 80), ("clean_small", 80), ("clean_s2", 55)])
def test_a_garbage_batch_on_one_of_two_ranks_is_found_at_its_step(name: str, step: int) -> None:
    recs = _copy(name)
    (bad,) = at(recs, step, rank=1)
    set_loss(bad, bad.loss * 2.0)
    for r in at(recs, step):
        r.grad_norm = (r.grad_norm or 1.0) * 1.7  # half the averaged gradient is the garbage batch's
    found = [d for d in analyze_records(recs).incidents if abs(d.onset_step - step) <= 1]
    assert found, [d.to_json() for d in analyze_records(recs).incidents]
    d = found[0]
    assert d.rank_local and d.first_rank == 1 and d.severity.rank >= Severity.MEDIUM.rank
    assert bad.samples and d.suspect_samples == bad.samples


def test_one_heavy_micro_batch_among_many_ranks_lifts_the_step_too_little() -> None:
    """The same 2x on one rank of 64 moves the step's loss by ~1.6%: no incident from one step
    (tests/core/test_detect_rules.py: twice in a row is one)."""
    recs = synthetic_records(300, 64, seed=8, tokens=256)
    (bad,) = at(recs, 250, rank=17)
    set_loss(bad, bad.loss * 2.0)
    assert analyze_records(recs).incidents == []
