"""Replay: the suspect batch and a control batch, from the last healthy checkpoint, in one process.

Runs as a separate single-process Ray task, away from the (frozen) worker group. The job
supplies how to build its model and batches: its entrypoint module defines

    def replay_hooks(config: dict, job: JobSpec) -> hooks

where ``hooks`` has ``model`` and ``optimizer`` (fresh, to load the checkpoint into),
``batch(sample_ids) -> batch`` (a batch made of exactly these samples),
``control_batch(n, exclude: set[str]) -> (batch, sample_ids)`` (normal samples) and
``loss(model, batch) -> scalar tensor``.

Verdict: the suspect batch *reproduces* when, from a healthy state, its loss is non-finite
or far above the control's, or its grad norm is ``grad_ratio`` times the control's: the
cause is the data. Otherwise the spike does not reproduce: transient or system (optimizer
state, a rank, a kernel). For numeric suspects the suspect batch is run again in fp32 with
the math SDPA backend: finite there but not in the default path points at a kernel or
precision, not at the model.
"""

from __future__ import annotations

import math
from typing import Any

LOSS_MARGIN = 1.5
GRAD_RATIO = 5.0


def run_replay(job: dict[str, Any], step: int, suspects: list[str], numeric: bool) -> dict[str, Any]:
    """Body of the Ray task; returns losses, grad norms and the verdict (plain JSON)."""
    import torch

    from supervisor.checkpoint.training_state import load_training_state
    from supervisor.config.job import JobSpec
    from supervisor.runtime.entrypoint import resolve_module
    from supervisor.runtime.stores import open_checkpoint_store

    torch.set_num_threads(1)
    spec = JobSpec.model_validate(job)
    module = resolve_module(spec.entrypoint)
    make = module.get("replay_hooks") if isinstance(module, dict) else getattr(module, "replay_hooks", None)
    if make is None:
        raise RuntimeError(f"{spec.entrypoint}: no replay_hooks(config, job) defined; cannot replay")
    hooks = make(dict(spec.config), spec)
    store = open_checkpoint_store(spec)
    load_training_state(store, step, rank=0, world_size=1, model=hooks.model, optimizer=hooks.optimizer)
    state = {k: v.detach().clone() for k, v in hooks.model.state_dict().items()}

    def measure(batch: Any, *, fp32_math: bool = False) -> dict[str, Any]:
        hooks.model.load_state_dict(state)
        hooks.model.zero_grad(set_to_none=True)
        model = hooks.model.float() if fp32_math else hooks.model
        ctx: Any = _math_sdpa() if fp32_math else _null()
        with ctx:
            loss = hooks.loss(model, batch)
            loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        gnorm = (
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            if grads
            else None
        )
        return {"loss": float(loss.detach()), "grad_norm": None if gnorm is None else float(gnorm)}

    control_batch, control_ids = hooks.control_batch(max(1, len(suspects)), set(suspects))
    out: dict[str, Any] = {
        "checkpoint_step": step,
        "suspect_samples": list(suspects),
        "control_samples": control_ids,
    }
    out["suspect"] = measure(hooks.batch(suspects)) if suspects else None
    out["control"] = measure(control_batch)
    if numeric and suspects:
        out["suspect_fp32_math"] = measure(hooks.batch(suspects), fp32_math=True)
    out["verdict"], out["why"] = verdict(out)
    return out


def verdict(r: dict[str, Any]) -> tuple[str, str]:
    """(``data`` | ``transient_or_system`` | ``kernel_or_precision`` | ``no_suspects``, why)."""
    s, c = r.get("suspect"), r["control"]
    if not s:
        return "no_suspects", "the diagnosis named no suspect samples"
    fp32 = r.get("suspect_fp32_math")
    if not math.isfinite(s["loss"]) and fp32 and math.isfinite(fp32["loss"]):
        return "kernel_or_precision", "non-finite in the default path, finite in fp32 with math SDPA"
    if not math.isfinite(s["loss"]):
        return "data", "the suspect batch is non-finite from a healthy state"
    if s["loss"] > LOSS_MARGIN * c["loss"]:
        return "data", f"suspect loss {s['loss']:.4g} > {LOSS_MARGIN}x control {c['loss']:.4g}"
    if s.get("grad_norm") and c.get("grad_norm") and s["grad_norm"] > GRAD_RATIO * c["grad_norm"]:
        return "data", f"suspect grad norm {s['grad_norm']:.4g} > {GRAD_RATIO}x control {c['grad_norm']:.4g}"
    return (
        "transient_or_system",
        f"suspect loss {s['loss']:.4g} vs control {c['loss']:.4g}: does not reproduce",
    )


def _math_sdpa() -> Any:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
