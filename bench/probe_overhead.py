"""Step time of the example LM with and without the probe, side by side in one run.

The baseline is the same loop with gradient clipping (which already computes the grad norm
the probe reuses), AdamW, the LR scheduler and zero_grad. Variants are interleaved in blocks
so machine noise hits all of them alike; the figures are the median and the 10th percentile
over blocks of the mean step time of a block (a block ends with a device sync on GPU); on a
shared machine the 10th percentile is the steadier one.

    python bench/probe_overhead.py                         # CPU, the example model
    python bench/probe_overhead.py --device cuda --d-model 1024 --layers 8 --seq 512 --batch 8
    python bench/probe_overhead.py --compare HEAD~3        # + the probe as it was at a git ref
    python bench/probe_overhead.py --threads 1 --clock cpu # CPU time: steadier on a shared machine
    python bench/probe_overhead.py --smoke                 # seconds, tiny sizes: the bench runs (tests/bench)

``--compare REF`` runs the minimal and the default probe of today beside the same two built
from ``supervisor/sdk/{metrics,step,probe}.py`` as they were at ``REF`` (the rest of the SDK
is today's), interleaved in the same blocks: a before/after measured side by side.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.tinylm.data import build_dataset, collate  # noqa: E402
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss  # noqa: E402
from supervisor import sdk  # noqa: E402
from supervisor.sdk.transport import BatchingTransport  # noqa: E402

VARIANTS: dict[str, dict[str, Any] | None] = {
    "baseline (clip, no probe)": None,
    "probe: loss+grad norm+nonfinite": {"norms": False, "fingerprint_every": 0},
    "probe: default (+sampled norms, fingerprint/50)": {},
    "probe: everything every step (fingerprint/1)": {"fingerprint_every": 1},
    "probe: + canary forward every 10 steps": {"canary_every": 10},
}


COMPARED: dict[str, dict[str, Any] | None] = {
    "baseline (clip, no probe)": None,
    "before: minimal (loss+grad norm+nonfinite)": {"norms": False, "fingerprint_every": 0, "_before": True},
    "after:  minimal (loss+grad norm+nonfinite)": {"norms": False, "fingerprint_every": 0},
    "before: default": {"_before": True},
    "after:  default": {},
}
_BEFORE: Any = None  # the Probe class of --compare REF


def probe_at(ref: str) -> Any:
    """``Probe`` from ``supervisor/sdk/{metrics,step,probe}.py`` at git ``ref`` (the rest: today's)."""
    root = Path(__file__).resolve().parents[1]
    names = [f"supervisor.sdk.{n}" for n in ("metrics", "step", "probe")]
    saved = {n: sys.modules.get(n) for n in names}
    mods: dict[str, types.ModuleType] = {}
    try:
        for full in names:  # in import order: each sees the old modules before it
            path = full.replace(".", "/") + ".py"
            shown = subprocess.run(
                ["git", "-C", str(root), "show", f"{ref}:{path}"], capture_output=True, text=True
            )
            if shown.returncode != 0:
                raise SystemExit(f"probe_overhead.py: --compare {ref}: {shown.stderr.strip()}")
            mod = types.ModuleType(full)
            mod.__file__ = f"{ref}:{path}"
            sys.modules[full] = mods[full] = mod
            exec(compile(shown.stdout, mod.__file__, "exec"), mod.__dict__)  # noqa: S102
    finally:
        for n, m in saved.items():
            if m is not None:
                sys.modules[n] = m
    return mods["supervisor.sdk.probe"].Probe


def to_device(batch: dict[str, Any], device: str) -> dict[str, Any]:
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()
    }


class Loop:
    def __init__(
        self, name: str, base: torch.nn.Module, dataset: Any, args: argparse.Namespace, settings: dict | None
    ) -> None:
        self.name, self.device, self.settings = name, args.device, settings
        self.model = copy.deepcopy(base)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=1e-3, weight_decay=0.1, fused=args.device == "cuda" or args.fused
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0)
        self.loader = sdk.SupervisedLoader(
            dataset, args.batch, seed=0, collate_fn=collate, rank=0, world_size=1
        )
        self.times: list[float] = []
        self.probe = None
        if settings is not None:
            self.transport = BatchingTransport(lambda batch: None)
            canary = (
                to_device(self.loader.fixed_batch(), args.device) if settings.get("canary_every") else None
            )
            settings = dict(settings)
            if settings.pop("_before", False):
                from supervisor.sdk.settings import ProbeSettings

                self.probe = _BEFORE(self.model, self.opt, transport=self.transport, scheduler=self.sched,
                                     loader=self.loader, loss_fn=lm_loss, canary_batch=canary,
                                     settings=ProbeSettings(grad_clip=1.0, **settings))  # fmt: skip
            else:
                self.probe = sdk.init(self.model, self.opt, scheduler=self.sched, loader=self.loader, loss_fn=lm_loss,
                                      transport=self.transport, canary_batch=canary, grad_clip=1.0, **settings)  # fmt: skip

    def run(self, steps: int, clock: Any = time.perf_counter) -> None:
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        sync()
        t0 = clock()
        for _ in range(steps):
            batch = to_device(next(self.loader), self.device)
            if self.probe is None:
                lm_loss(self.model, batch).loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
            else:
                with self.probe.step(batch) as s:
                    s.backward(lm_loss(self.model, batch))
                    s.optimizer_step()
        sync()
        self.times.append((clock() - t0) / steps)


def _p10(xs: list[float]) -> float:
    """10th percentile of block means: the least disturbed blocks, robust on a shared machine."""
    return sorted(xs)[len(xs) // 10]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--block-steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    ap.add_argument("--compare", metavar="REF", default=None, help="also the probe as it was at this git ref")
    ap.add_argument("--fused", action="store_true", help="fused AdamW on CPU too (always on CUDA)")
    ap.add_argument(
        "--clock", default="wall", choices=["wall", "cpu"],
        help="cpu: this process's CPU time (all its threads), not wall time: on a shared CPU machine other "
        "processes' load then stops counting (CPU only; with --threads 1 it is the step's whole cost)",
    )  # fmt: skip
    ap.add_argument(
        "--smoke", action="store_true", help="a tiny model, 3 blocks of 2 steps (no figures to keep)"
    )
    args = ap.parse_args()
    data_bytes = 300_000
    if args.smoke:
        args.d_model, args.layers, args.heads, args.seq, args.batch = 16, 1, 2, 16, 2
        args.blocks, args.block_steps, args.threads, data_bytes = 3, 2, 1, 20_000
    global _BEFORE
    if args.clock == "cpu" and args.device != "cpu":
        print("probe_overhead.py: --clock cpu: only with --device cpu (a GPU step's time is not CPU time)",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    variants = VARIANTS
    if args.compare:
        _BEFORE, variants = probe_at(args.compare), COMPARED
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = TinyLMConfig(seq_len=args.seq, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads)
    base = TinyLM(cfg).to(args.device)
    dataset = build_dataset(seq_len=args.seq, max_bytes_per_source=data_bytes)
    loops = [Loop(name, base, dataset, args, s) for name, s in variants.items()]
    for loop in loops:
        loop.run(args.block_steps, clock)  # warm-up
        loop.times.clear()
    for i in range(args.blocks):
        for loop in loops[i % len(loops) :] + loops[: i % len(loops)]:  # rotate the order every block
            loop.run(args.block_steps, clock)
    params = sum(p.numel() for p in base.parameters())
    print(f"model: {params / 1e6:.2f}M params, d_model={args.d_model} layers={args.layers} seq={args.seq} "
          f"batch={args.batch}, device={args.device}, threads={torch.get_num_threads()}, "
          f"{args.blocks} blocks x {args.block_steps} steps, AdamW fused={args.device == 'cuda' or args.fused}, "
          f"clock={args.clock}"
          + (f", before = {args.compare}" if args.compare else ""))  # fmt: skip
    ref, ref_low = statistics.median(loops[0].times), _p10(loops[0].times)
    print(f"  {'variant':<48} {'median':>8}  {'vs base':>7}   {'p10':>8}  {'vs base':>7}")
    for loop in loops:
        med, low = statistics.median(loop.times), _p10(loop.times)
        print(f"  {loop.name:<48} {med * 1e3:8.3f}  {100 * (med / ref - 1):+6.2f}%   {low * 1e3:8.3f}  "
              f"{100 * (low / ref_low - 1):+6.2f}%   (ms/step)")  # fmt: skip
        if loop.probe is not None:
            print(
                f"  {'':<48} update-norm sample: {100 * loop.probe.sampler.memory_fraction:.2f}% of param memory"
            )
            loop.probe.close()


if __name__ == "__main__":
    main()
