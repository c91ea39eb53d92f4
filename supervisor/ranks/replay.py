"""Replay, offline path: the suspect batch and a control batch, from a checkpoint, in one process.

The ``replay`` action runs on the job's own ranks while they are alive (``supervisor.sdk.replay``);
this separate single-process Ray task is the path once training has ended or when the ranks
cannot replay. A DCP checkpoint saved by N ranks loads here on one (resharded). The job
supplies how to build its model and batches: its entrypoint module defines

    def replay_hooks(config: dict, job: JobSpec) -> hooks

where ``hooks`` has ``model`` and ``optimizer`` (fresh, to load the checkpoint into),
``batch(sample_ids) -> batch`` (a batch made of exactly these samples),
``control_batch(n, exclude: set[str]) -> (batch, sample_ids)`` (normal samples) and
``loss(model, batch) -> scalar tensor``. The verdict is the live path's
(``supervisor.sdk.replay``, which says how it is reached).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
from pathlib import Path
from typing import Any

from supervisor.sdk.replay import verdict

HOOKS = "replay_hooks"


def has_replay_hooks(entrypoint: str) -> bool | None:
    """Whether the entrypoint's module defines (or imports) ``replay_hooks``, read from its source
    without running it (the supervisor never imports the user's training code). None when it
    cannot tell: a command entrypoint (its ranks may still replay through the SDK), or a module
    whose source is not found."""
    if len(entrypoint.split()) > 1:
        return None
    try:
        if entrypoint.endswith(".py"):
            path = Path(entrypoint)
        else:
            spec = importlib.util.find_spec(entrypoint.partition(":")[0])
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                return None
            path = Path(spec.origin)
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    return HOOKS in _top_level_names(tree)


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def run_replay(job: dict[str, Any], step: int, suspects: list[str], numeric: bool) -> dict[str, Any]:
    """Body of the Ray task; returns losses, grad norms and the verdict (plain JSON)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from supervisor.checkpoint.lifecycle import open_checkpoint_store
    from supervisor.checkpoint.training_state import load_training_state
    from supervisor.config.job import JobSpec
    from supervisor.ranks.entrypoint import resolve_module

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
        ctx: Any = sdpa_kernel(SDPBackend.MATH) if fp32_math else contextlib.nullcontext()
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
