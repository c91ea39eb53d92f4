"""Severity says what an operator must do: a one-step blip that is back in band at once is a note
(`low`); `medium` and above mean the policy will act (issue 19)."""

from __future__ import annotations

from supervisor.core.analysis import analyze_records
from supervisor.core.model import Phenotype, Severity
from supervisor.traces.synthetic import at, set_loss, synthetic_records


def _llmc_like(seed: int, loss_mult: float, grad_mult: float, steps: tuple[int, ...] = (700,)):  # type: ignore[no-untyped-def]
    """One rank, loss and grad norm only (what llm.c's main log holds), a long healthy run."""
    recs = synthetic_records(900, 1, seed=seed, heavy_tail=True, loss_noise=0.01)
    for r in recs:
        r.update_norm = r.param_norm = r.tokens = r.loss_sum = None
    for s in steps:
        for r in at(recs, s):
            r.loss *= loss_mult
            r.grad_norm = (r.grad_norm or 1.0) * grad_mult
    return recs


def test_one_step_blip_with_grad_norm_5x_back_next_step_is_low() -> None:
    """The llm.c GPT-2 124M case: loss 3.48 -> 3.78 (+8.6%), grad norm 5x, back in band next step."""
    for seed in range(3):
        res = analyze_records(_llmc_like(seed, 3.78 / 3.48, 5.0))
        assert [d.severity for d in res.incidents] in ([], [Severity.LOW]), [
            d.to_json() for d in res.incidents
        ]


def test_a_transient_of_real_size_is_still_acted_on() -> None:
    res = analyze_records(_llmc_like(0, 1.8, 12.0))
    (d,) = res.incidents
    assert d.phenotype is Phenotype.TRANSIENT and d.severity.rank >= Severity.MEDIUM.rank


def test_a_blip_that_lasts_two_steps_is_not_a_note() -> None:
    res = analyze_records(_llmc_like(1, 1.3, 6.0, steps=(700, 701, 702)))
    assert res.incidents and max(d.severity.rank for d in res.incidents) >= Severity.MEDIUM.rank


def _bad_batch_on(*, ranks: int, seed: int, rank: int, loss_x: float, grad_x: float) -> list:  # type: ignore[type-arg]
    """400 synthetic steps; at step 300 one rank's loss times ``loss_x``, every rank's grad norm
    times ``grad_x`` (the averaged gradients carry the bad batch's share)."""
    recs = synthetic_records(400, ranks, seed=seed)
    (bad,) = at(recs, 300, rank=rank)
    set_loss(bad, bad.loss * loss_x)
    for r in at(recs, 300):
        r.grad_norm = (r.grad_norm or 1.0) * grad_x
    return recs


def test_rank_local_bad_batch_stays_medium() -> None:
    res = analyze_records(_bad_batch_on(ranks=4, seed=5, rank=2, loss_x=1.4, grad_x=4))
    assert res.incidents and res.incidents[0].rank_local
    assert res.incidents[0].severity.rank >= Severity.MEDIUM.rank


def _calm_lr_bug(seed: int) -> list:  # type: ignore[type-arg]
    """The matrix's cured LR bug (gru/AdamW, step 120): the LR 30x from the onset on, the update
    ratio ~28x with it, the grad norm and the loss within their noise (Adam's steps are bounded;
    the loss of these small models is noisy); the trace ends where the supervisor rolled back."""
    recs = synthetic_records(310, 2, seed=seed)
    for r in recs:
        if r.step >= 300:
            r.lr = (r.lr or 1e-3) * 30
            r.update_norm = (r.update_norm or 1.0) * 28
    return recs


def test_an_lr_jump_the_policy_rolls_back_is_not_a_note() -> None:
    """A specific optimizer finding (LR 30x, update ratio 28x) gets a rollback from the policy
    however small the loss's reaction: medium at least, never `low`."""
    for seed in range(3):
        res = analyze_records(_calm_lr_bug(seed))
        assert res.incidents, seed
        d = res.incidents[0]
        evidence = " ".join(e for c in d.causes for e in c.evidence)
        assert "learning rate changed" in evidence and d.severity.rank >= Severity.MEDIUM.rank, d.to_json()


def test_a_rank_local_garbage_batch_with_calm_global_gradients_is_not_a_note() -> None:
    """The matrix's gru/SGD garbage batch: one rank's loss ~2.6x the other's for one step, the
    averaged gradients barely move (grad norm 1.5-2x, update ratio 1x). The policy excludes the
    batch (rule rank_local): medium at least."""
    res = analyze_records(_bad_batch_on(ranks=2, seed=11, rank=1, loss_x=2.6, grad_x=1.5))
    (d,) = res.incidents
    assert d.rank_local and d.first_rank == 1, d.to_json()
    assert d.severity.rank >= Severity.MEDIUM.rank, d.to_json()
