"""A data mixture that moves at a step moves the gradients with it: benign, not an optimizer fault.

Sampler cell ``709587:846909`` (gpt2, AdamW, fp16, 4 ranks): the loader's source weights changed at
step 59 (web gone, tests 17% -> 77% of the tokens). The new data's gradients were twice the old
ones' and, while Adam's second moment caught up, the update ratio rose 1.47x its level over three
steps; the loss stayed in band (it fell). Rule ``grad`` opened an incident on the three steps and a
rollback re-ran 38 steps. The tokens each source contributes are in every record: a move of the
shares beyond every step-to-step difference of the window is an intended change of the data, and
the gradient-side levels re-form from it, as after an LR override or a warm restart. The loss keeps
its band, and an oversized update or an LR fault is still judged against the run's extremes.
"""

from __future__ import annotations

import json
import math
import random

from supervisor.core.analysis import StreamingAnalyzer, analyze_records, group_steps
from supervisor.core.records import Record

BEFORE = {"code": 0.2, "docstrings": 0.15, "tests": 0.15, "web": 0.5}
AFTER = {"code": 0.1, "docstrings": 0.2, "tests": 0.7}
PER_TOKEN = {"code": 3.0, "docstrings": 3.2, "tests": 2.6, "web": 3.3}
MOVE = 80

#: The gradients' response to the new data, from the cell's trace: the update ratio over its old
#: level at the move and the steps after it (Adam's second moment catching up), and the grad norm's.
UPDATE_RISE = [1.18, 1.32, 1.45, 1.47, 1.47, 1.46, 1.44, 1.40, 1.36, 1.32, 1.28, 1.24, 1.2, 1.17, 1.15]
GRAD_RISE = [1.7, 1.9, 1.9, 1.6, 2.4, 1.9, 1.8, 1.2, 1.3, 1.5, 1.4, 1.4, 1.4, 1.4, 1.4]


def _rise(table: list[float], step: int, move: int | None) -> float:
    if move is None or step < move:
        return 1.0
    return table[min(step - move, len(table) - 1)]


def mixture_run(
    seed: int, *, move: int | None = MOVE, rise_at: int | None = MOVE, lr_factor_at: int | None = None
) -> list[Record]:
    """4 ranks x 16 samples of 32 tokens a step, each sample drawn from the sources' weights; the
    weights change at ``move`` (None: never) and the gradients rise at ``rise_at`` (None: never).
    ``lr_factor_at``: from that step the LR is 10x the schedule's (a bug)."""
    rng = random.Random(seed)
    out: list[Record] = []
    for step in range(1, 151):
        weights = AFTER if move is not None and step >= move else BEFORE
        decay = 1.0 + 0.6 * math.exp(-step / 40.0)
        lr = (
            3e-3
            * min(1.0, step / 20.0)
            * (10.0 if lr_factor_at is not None and step >= lr_factor_at else 1.0)
        )
        grad = 0.27 * _rise(GRAD_RISE, step, rise_at) * math.exp(rng.gauss(0.0, 0.12))
        ratio = 2.3 * lr * _rise(UPDATE_RISE, step, rise_at) * math.exp(rng.gauss(0.0, 0.01))
        for rank in range(4):
            sources: dict[str, dict[str, float]] = {}
            samples = []
            for i in range(16):
                name = rng.choices(list(weights), weights=list(weights.values()))[0]
                part = sources.setdefault(name, {"tokens": 0, "loss_sum": 0.0})
                part["tokens"] += 32
                part["loss_sum"] += 32 * PER_TOKEN[name] * decay * math.exp(rng.gauss(0.0, 0.05))
                samples.append(f"{name}:doc{rng.randrange(10_000)}:{step}.{rank}.{i}")
            loss_sum = sum(p["loss_sum"] for p in sources.values())
            out.append(
                Record(
                    step=step, rank=rank, world_size=4, loss=loss_sum / 512, loss_sum=loss_sum, tokens=512,
                    lr=lr, grad_norm=grad, param_norm=20.0, update_norm=20.0 * ratio, samples=samples,
                    sources=sources,
                )
            )  # fmt: skip
    return out


def test_gradients_that_rise_with_a_mixture_move_open_no_incident() -> None:
    for seed in range(6):
        result = analyze_records(mixture_run(seed))
        assert result.incidents == [], (seed, [d.to_json() for d in result.incidents])
        moved = [b for b in result.benign_shifts if b.metric == "token_shares"]
        assert [b.step for b in moved] == [MOVE], (seed, [b.to_json() for b in result.benign_shifts])
        assert moved[0].source == "tests" and "web" in moved[0].note


def test_the_same_rise_with_the_mixture_unchanged_is_an_incident() -> None:
    """The control: nothing explains the gradients' rise, so it is evidence."""
    for seed in range(3):
        result = analyze_records(mixture_run(seed, move=None))
        assert result.incidents, seed
        assert not [b for b in result.benign_shifts if b.metric == "token_shares"]


def test_an_lr_fault_at_the_mixture_move_is_still_an_incident() -> None:
    for seed in range(3):
        result = analyze_records(mixture_run(seed, lr_factor_at=MOVE + 5))
        assert result.incidents, seed
        assert any(MOVE <= d.onset_step <= MOVE + 5 for d in result.incidents), [
            d.to_json() for d in result.incidents
        ]


def test_a_batch_drawn_from_the_same_weights_is_no_move() -> None:
    """Clean runs: the shares of a step scatter around the weights (16 samples a rank), never a move."""
    for seed in range(20):
        result = analyze_records(mixture_run(seed, move=None, rise_at=None))
        assert result.incidents == [] and result.benign_shifts == [], seed


def test_a_rollback_to_before_the_move_sees_it_again_on_the_replay() -> None:
    """The move is taken back with the steps a rollback re-runs, and found again at the same step;
    a supervisor restored between its first step and the one that confirms it finds it too."""
    steps = dict(group_steps(mixture_run(1)))
    an = StreamingAnalyzer()
    for step in range(1, MOVE + 1):
        an.observe_step(step, steps[step])
    state = an.state_dict()
    for step in range(MOVE + 1, MOVE + 10):
        an.observe_step(step, steps[step])
    for step in range(MOVE - 20, 151):  # an unannounced replay from 60 on
        an.observe_step(step, steps[step])
    result = an.finish()
    assert result.incidents == [], [d.to_json() for d in result.incidents]
    assert [b.step for b in result.benign_shifts if b.metric == "token_shares"] == [MOVE]
    restored = StreamingAnalyzer()
    restored.load_state_dict(json.loads(json.dumps(state)))
    for step in range(MOVE + 1, 151):
        restored.observe_step(step, steps[step])
    after = restored.finish()
    assert after.incidents == [] and [b.step for b in after.benign_shifts] == [MOVE]


def test_a_stream_of_new_source_names_keeps_the_watch_bounded() -> None:
    """Hostile or runaway source names: the first ``MAX_SOURCES`` are tracked, the rest pooled as one."""
    from supervisor.core.mixture import KEEP, MAX_SOURCES, OTHER, MixtureWatch

    watch = MixtureWatch()
    for step in range(1, 1001):
        watch.push(step, {f"s{step}.{i}": (32.0, 3.0) for i in range(2 * MAX_SOURCES)})
    assert len(watch._sum) <= MAX_SOURCES + 1 and len(watch._steps) <= KEEP
    assert all(len(sh) <= MAX_SOURCES + 1 for _, sh in watch._steps)
    assert watch._steps[-1][1] == {OTHER: 1.0}
