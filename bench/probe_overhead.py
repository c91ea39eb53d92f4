"""Step time of the example LM with and without the probe, paired step by step in one run.

The baseline is the same loop with gradient clipping (which already computes the grad norm
the probe reuses), AdamW, the LR scheduler and zero_grad. Every variant trains its own copy of
the same model. A **round** runs ``--block-steps`` steps of every variant once, in an order
shuffled per round (seeded), so what disturbs the machine for a moment hits the variants of a
round alike; the figure of a variant is the **median over rounds of its paired ratio** (its
round time / the baseline's round time in the same round), with a distribution-free 95%
confidence interval of that median (order statistics of the ratios). Pairing takes out the
drift between rounds that made block medians spread more than the probe costs. Python's
garbage collector is off while a round is timed (collected between rounds), and on CPU torch
runs on ``--threads`` threads (1 unless told).

    python bench/probe_overhead.py                         # CPU, the example model
    python bench/probe_overhead.py --device cuda --d-model 1024 --layers 8 --seq 512 --batch 8
    python bench/probe_overhead.py --compare HEAD~3        # + the probe as it was at a git ref
    python bench/probe_overhead.py --compare HEAD --compare-modules metrics   # only metrics.py at HEAD
    python bench/probe_overhead.py --clock cpu             # CPU time: steadier on a shared machine
    python bench/probe_overhead.py --variants minimal,default   # fewer variants: tighter pairs
    python bench/probe_overhead.py --smoke                 # seconds, tiny sizes: the bench runs (tests/bench)

``--compare REF`` runs the minimal and the default probe of today beside the same two built
from ``supervisor/sdk/{metrics,step,probe}.py`` as they were at ``REF`` (the rest of the SDK
is today's), interleaved in the same rounds: a before/after measured side by side.
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import random
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
SHORT = dict(zip(("minimal", "default", "fingerprint", "canary"), list(VARIANTS)[1:], strict=True))
"""``--variants`` names (the baseline always runs)."""


COMPARED: dict[str, dict[str, Any] | None] = {
    "baseline (clip, no probe)": None,
    "before: minimal (loss+grad norm+nonfinite)": {"norms": False, "fingerprint_every": 0, "_before": True},
    "after:  minimal (loss+grad norm+nonfinite)": {"norms": False, "fingerprint_every": 0},
    "before: default": {"_before": True},
    "after:  default": {},
}
_BEFORE: Any = None  # the Probe class of --compare REF


def probe_at(ref: str, old: tuple[str, ...] = ("metrics", "step", "probe")) -> Any:
    """``Probe`` built from ``supervisor/sdk/{metrics,step,probe}.py``, those named in ``old`` as they
    were at git ``ref``, the others (and the rest of the SDK) as they are today."""
    root = Path(__file__).resolve().parents[1]
    names = [f"supervisor.sdk.{n}" for n in ("metrics", "step", "probe")]
    saved = {n: sys.modules.get(n) for n in names}
    mods: dict[str, types.ModuleType] = {}
    try:
        for full in names:  # in import order: each sees the old modules before it
            path = full.replace(".", "/") + ".py"
            if full.rsplit(".", 1)[1] not in old:
                text, where = (root / path).read_text(encoding="utf-8"), str(root / path)
            else:
                shown = subprocess.run(
                    ["git", "-C", str(root), "show", f"{ref}:{path}"], capture_output=True, text=True
                )
                if shown.returncode != 0:
                    raise SystemExit(f"probe_overhead.py: --compare {ref}: {shown.stderr.strip()}")
                text, where = shown.stdout, f"{ref}:{path}"
            mod = types.ModuleType(full)
            mod.__file__ = where
            sys.modules[full] = mods[full] = mod
            exec(compile(text, where, "exec"), mod.__dict__)  # noqa: S102
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
        self.fb: list[float] = []
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
        """``steps`` steps: their mean time, and (on CPU) the mean time of their forward + backward
        (``lm_loss`` and the backward: the same operations with and without the probe)."""
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        sync()
        t0, fb = clock(), 0.0
        for _ in range(steps):
            batch = to_device(next(self.loader), self.device)
            if self.probe is None:
                a = clock()
                lm_loss(self.model, batch).loss.backward()
                fb += clock() - a
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
            else:
                with self.probe.step(batch) as s:
                    a = clock()
                    s.backward(lm_loss(self.model, batch))
                    fb += clock() - a
                    s.optimizer_step()
        sync()
        self.times.append((clock() - t0) / steps)
        self.fb.append(fb / steps)

    @property
    def rest(self) -> list[float]:
        """Per round: the step's time outside its forward + backward (where the probe works)."""
        return [t - f for t, f in zip(self.times, self.fb, strict=True)]


def measure(loops: list[Loop], rounds: int, steps: int, clock: Any, seed: int = 0, warmup: int = 3) -> None:
    """``warmup`` untimed rounds, then ``rounds`` timed ones: each runs ``steps`` steps of every
    loop, in an order shuffled per round; the garbage collector runs between rounds only."""
    order = random.Random(seed)
    for r in range(warmup + rounds):
        shuffled = order.sample(loops, len(loops))
        gc.collect()
        gc.disable()
        try:
            for loop in shuffled:
                loop.run(steps, clock)
        finally:
            gc.enable()
        if r < warmup:
            for loop in loops:
                loop.times.clear()
                loop.fb.clear()


def median_ci(values: list[float]) -> tuple[float, float, float]:
    """Median and its 95% confidence interval (lo, hi): distribution-free, from the order
    statistics (the binomial count of values below the median; normal approximation, clamped
    to the sample at few values)."""
    xs = sorted(values)
    n = len(xs)
    k = max(0, math.floor(n / 2 - 1.96 * math.sqrt(n) / 2))
    return statistics.median(xs), xs[k], xs[min(n - 1, n - 1 - k)]


def paired(times: list[float], base: list[float]) -> tuple[float, float, float]:
    """Median over rounds of ``times[r] / base[r] - 1``, with its 95% confidence interval."""
    return median_ci([a / b - 1 for a, b in zip(times, base, strict=True)])


def paired_rest(loop: Loop, base: Loop) -> tuple[float, float, float]:
    """The probe's cost outside forward + backward, per round: (the loop's step time outside its
    forward + backward - the baseline's, in the same round) / the baseline's median step time;
    median and 95% interval. The forward + backward, ~80% of a CPU step and its main noise, are
    the same operations in both loops and drop out of the difference."""
    step = statistics.median(base.times)
    return median_ci([(a - b) / step for a, b in zip(loop.rest, base.rest, strict=True)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=60, help="timed rounds (each: every variant once)")
    ap.add_argument("--block-steps", type=int, default=2, help="steps of one variant in a round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    ap.add_argument("--seed", type=int, default=0, help="seeds the order of the variants in each round")
    ap.add_argument("--variants", default=",".join(SHORT), help=f"comma-separated, of: {', '.join(SHORT)}")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch default)")
    ap.add_argument("--compare", metavar="REF", default=None, help="also the probe as it was at this git ref")
    ap.add_argument(
        "--compare-modules", default="metrics,step,probe",
        help="with --compare: which of supervisor/sdk/{metrics,step,probe}.py are taken at REF",
    )  # fmt: skip
    ap.add_argument("--fused", action="store_true", help="fused AdamW on CPU too (always on CUDA)")
    ap.add_argument(
        "--clock", default="wall", choices=["wall", "cpu"],
        help="cpu: this process's CPU time (all its threads), not wall time: on a shared CPU machine other "
        "processes' load then stops counting (CPU only; with --threads 1 it is the step's whole cost)",
    )  # fmt: skip
    ap.add_argument(
        "--smoke", action="store_true", help="a tiny model, 3 rounds of 2 steps (no figures to keep)"
    )
    args = ap.parse_args()
    data_bytes = 300_000
    if args.smoke:
        args.d_model, args.layers, args.heads, args.seq, args.batch = 16, 1, 2, 16, 2
        args.blocks, args.block_steps, args.threads, args.warmup, data_bytes = 3, 2, 1, 1, 20_000
    global _BEFORE
    if args.clock == "cpu" and args.device != "cpu":
        print("probe_overhead.py: --clock cpu: only with --device cpu (a GPU step's time is not CPU time)",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(names) - set(SHORT))
    if unknown:
        print(f"probe_overhead.py: --variants: unknown {unknown[0]!r} (choices: {', '.join(SHORT)})",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    variants = {k: v for k, v in VARIANTS.items() if v is None or k in {SHORT[n] for n in names}}
    if args.compare:
        old = tuple(m.strip() for m in args.compare_modules.split(",") if m.strip())
        if not old or set(old) - {"metrics", "step", "probe"}:
            print(f"probe_overhead.py: --compare-modules {args.compare_modules!r}: choose from metrics, step, probe",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        _BEFORE, variants = probe_at(args.compare, old), COMPARED
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = TinyLMConfig(seq_len=args.seq, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads)
    base = TinyLM(cfg).to(args.device)
    dataset = build_dataset(seq_len=args.seq, max_bytes_per_source=data_bytes)
    loops = [Loop(name, base, dataset, args, s) for name, s in variants.items()]
    measure(loops, args.blocks, args.block_steps, clock, args.seed, args.warmup)
    params = sum(p.numel() for p in base.parameters())
    print(f"model: {params / 1e6:.2f}M params, d_model={args.d_model} layers={args.layers} seq={args.seq} "
          f"batch={args.batch}, device={args.device}, threads={torch.get_num_threads()}, "
          f"{args.blocks} rounds x {args.block_steps} steps, AdamW fused={args.device == 'cuda' or args.fused}, "
          f"clock={args.clock}"
          + (f", before = {args.compare}" if args.compare else ""))  # fmt: skip
    split = args.device == "cpu"  # a CUDA forward + backward is launched, not run, where it is timed
    print(f"  {'variant':<48} {'median':>8}  {'paired':>7}   {'95% CI':>18}"
          + ("   outside forward+backward, paired [95% CI]" if split else ""))  # fmt: skip
    for loop in loops:
        med = statistics.median(loop.times)
        mid, lo, hi = paired(loop.times, loops[0].times)
        rest = "   {:+6.2f}% [{:+6.2f}%, {:+6.2f}%]".format(*(100 * x for x in paired_rest(loop, loops[0])))
        print(f"  {loop.name:<48} {med * 1e3:8.3f}  {100 * mid:+6.2f}%   [{100 * lo:+6.2f}%, {100 * hi:+6.2f}%]"
              f"{rest if split else ''}   (ms/step)")  # fmt: skip
        if loop.probe is not None:
            print(
                f"  {'':<48} update-norm sample: {100 * loop.probe.sampler.memory_fraction:.2f}% of param memory"
            )
            loop.probe.close()


if __name__ == "__main__":
    main()
