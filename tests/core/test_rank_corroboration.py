"""Which gradients can corroborate one rank's loss: this step's, never the update of the step before.

Sampler cell ``910069`` (gpt2, AdamW, constant LR, accumulation 4, fp32, 4 ranks, no fault): a
medium `rank_local` incident at step 51-52. Rank 1's loss was 1.18x the other ranks' (3.48 against
~2.95: beyond the young run's usual spread, 3.3 sigma above its own level), this step's grad norm
and update ratio calm (z 0.4 and 1.5), and the update ratio of step 51 at z 3.6. The "one rank far
out once, with the gradients moving with it" rule took that previous update as the corroboration.
That update changed every rank's weights alike: it lifts every rank's loss, never one rank's alone,
so only this step's gradients (computed on that rank's batch, then averaged) can move with it.

Trace: ``data/sampler_clean_gpt2_acc4_r4.jsonl.gz``, that cell's steps 1-70 (`attrs` dropped).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from supervisor.core.analysis import analyze_records
from supervisor.core.model import Severity
from supervisor.core.records import Record
from supervisor.traces import read_trace

DATA = Path(__file__).resolve().parent / "data"
TRACE = DATA / "sampler_clean_gpt2_acc4_r4.jsonl.gz"


def _records() -> list[Record]:
    return list(read_trace(TRACE).records)


def test_a_clean_four_rank_run_with_accumulation_opens_nothing_on_one_ranks_noise() -> None:
    res = analyze_records(_records())
    acted = [d.to_json() for d in res.incidents if d.severity.rank >= Severity.MEDIUM.rank]
    assert not acted, acted


def test_the_same_rank_excess_with_this_steps_gradients_out_is_still_an_incident() -> None:
    """The evidence the rule reads is still there: the step's own grad norm and update ratio
    moving with the rank (a bad batch on it) open the incident on rank 1."""
    out = []
    for r in _records():
        if r.step == 52 and r.grad_norm is not None and r.update_norm is not None:
            r = dataclasses.replace(r, grad_norm=r.grad_norm * 3.0, update_norm=r.update_norm * 3.0)
        out.append(r)
    res = analyze_records(out)
    found = [d for d in res.incidents if d.rank_local and 50 <= d.onset_step <= 52]
    assert found, [d.to_json() for d in res.incidents]
    assert found[0].first_rank == 1, found[0].to_json()
