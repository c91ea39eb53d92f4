"""Replay on the training ranks: does the suspect batch reproduce the spike from a healthy state?

Run by every rank of a frozen job at the same boundary (the ``Replay`` directive): the live
model and optimizer state is copied to host memory, checkpoint ``step`` is loaded in its place
through DCP (so sharded FSDP2 / DTensor state works, resharded if the world size changed), the
suspect batch and a control batch of normal samples each run forward and backward, and the
live state (with its RNG and hyperparameters) is put back. The same code path as a training
step, on the same ranks and devices, so a model that needs the job's GPUs can be replayed
(Megatron-LM's rerun state machine replays a step on the job's own ranks the same way).

Batches come from the job's ``SupervisedLoader`` by sample ID (map-style or streaming, found
without a table of the dataset); the loss from the probe's
``loss_fn``. Rank 0 writes the result to ``<job>/replays/<directive id>.json`` in the job's
storage, where the supervisor's ``replay`` action reads it. A replay that runs past its
deadline stops, puts the live state back and fails the directive.

Verdict: the suspect batch *reproduces* when, from the checkpoint's state, its loss is
non-finite or far above the control's, or its grad norm is ``GRAD_RATIO`` times the
control's: the cause is the data. Otherwise it does not reproduce: transient or system.
For numeric suspects the suspect batch also runs in fp32 with the math SDPA backend: finite
there but not in the default path points at a kernel or precision, not at the model.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from supervisor.errors import SupervisorError

if TYPE_CHECKING:
    from supervisor.sdk.directives import Replay
    from supervisor.sdk.probe import Probe

LOSS_MARGIN = 1.5
GRAD_RATIO = 5.0


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


def result_key(job: str, directive_id: str) -> str:
    """Where rank 0 leaves the result, relative to the storage root."""
    return f"{job}/replays/{directive_id}.json"


def replay_on_ranks(probe: Probe, d: Replay) -> dict[str, Any]:
    """The body of the ``Replay`` directive on one rank (module doc); returns the result."""
    import torch

    from supervisor.checkpoint import dcp_state
    from supervisor.checkpoint.torch_io import capture_rng, restore_rng
    from supervisor.checkpoint.training_state import load_training_state

    store, loader = probe.checkpoint, probe.loader
    # Map-style and streaming SupervisedLoaders fetch samples by ID (``samples``); anything else cannot.
    if store is None or probe.loss_fn is None or loader is None or not hasattr(loader, "samples"):
        raise SupervisorError("replay on the ranks needs a checkpoint store, loss_fn and a "
                              "SupervisedLoader (sdk.init)", field="replay")  # fmt: skip
    deadline = time.monotonic() + d.deadline_s
    live = dcp_state.HostStager()
    stash = live.stage(dcp_state.live_state(probe.model, probe.optimizer))
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in probe.optimizer.param_groups]
    rng = capture_rng()
    try:
        load_training_state(store, d.step, rank=probe.rank, world_size=probe.world_size, model=probe.model,
                            optimizer=probe.optimizer)  # fmt: skip
        suspects = [str(s) for s in d.suspects]
        control, control_ids = _control_batch(loader, max(1, len(suspects)), set(suspects))
        out: dict[str, Any] = {"checkpoint_step": d.step, "suspect_samples": suspects, "control_samples": control_ids,
                               "world_size": probe.world_size, "on_ranks": True}  # fmt: skip
        out["suspect"] = (
            _measure(probe, _batch_of(loader, suspects, deadline), deadline) if suspects else None
        )
        out["control"] = _measure(probe, control, deadline)
        if d.numeric and suspects:
            out["suspect_fp32_math"] = _measure(
                probe, _batch_of(loader, suspects, deadline), deadline, fp32_math=True
            )
        out["verdict"], out["why"] = verdict(out)
    finally:
        # Put the live state back whatever happened: training resumes from where it was frozen.
        probe.model.zero_grad(set_to_none=True)
        with torch.no_grad():
            _copy_into(dcp_state.live_state(probe.model, probe.optimizer), stash)
        for group, saved in zip(probe.optimizer.param_groups, hyper, strict=True):
            group.update(saved)
        restore_rng(rng)
        live.close()
    if probe.rank == 0:
        store.backend.put_bytes(result_key(store.job, d.id), json.dumps(out).encode())
    probe.log.info("replayed on the ranks", step=d.step, verdict=out["verdict"], why=out["why"])
    return out


def _measure(probe: Probe, batch: Any, deadline: float, *, fp32_math: bool = False) -> dict[str, Any]:
    from supervisor.sdk.metrics import grad_norm

    if time.monotonic() > deadline:
        raise SupervisorError("replay ran past its deadline (Replay.deadline_s)", field="replay")
    model = probe.model
    model.zero_grad(set_to_none=True)
    ctx: Any = nullcontext()
    if fp32_math:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = sdpa_kernel(SDPBackend.MATH)
    with ctx:
        out: Any = probe.loss_fn(model, batch)  # type: ignore[misc]
        loss = getattr(out, "loss", out)
        (loss.float() if fp32_math else loss).backward()
    norm = grad_norm([p for p in model.parameters() if p.requires_grad], None)
    return {"loss": float(loss.detach()), "grad_norm": float(norm)}


def _batch_of(loader: Any, sample_ids: list[str], deadline: float | None = None) -> Any:
    """A batch of exactly these samples; an unknown ID is an error, never a smaller batch.

    The loader finds them without a table of the dataset (IDs inverted to indices, or looked up
    lazily: ``SupervisedLoader.samples``): replay's memory does not grow with the dataset."""
    try:
        items = loader.samples(sample_ids, deadline=deadline)
    except (KeyError, TimeoutError) as exc:
        raise SupervisorError(f"replay: {exc.args[0]}", field="suspects") from exc
    return loader.collate_fn(items)


def _control_batch(loader: Any, n: int, exclude: set[str]) -> tuple[Any, list[str]]:
    """``n`` normal samples (the same on every rank), none of ``exclude`` nor of the loader's exclusions."""
    chosen = loader.control_ids(n, exclude)
    return _batch_of(loader, chosen), chosen


def _copy_into(live: Any, saved: Any) -> None:
    """Copy a staged state dict back into the live one, tensor by tensor (DTensors: their local shards)."""
    import torch

    if isinstance(live, dict):
        for key, value in live.items():
            _copy_into(value, saved[key])
    elif isinstance(live, list | tuple):
        for a, b in zip(live, saved, strict=True):
            _copy_into(a, b)
    elif isinstance(live, torch.Tensor):
        dst = live.to_local() if hasattr(live, "to_local") else live
        src = saved.to_local() if hasattr(saved, "to_local") else saved
        dst.copy_(src)
