"""Generate the labelled fault corpus: REAL training runs of examples/tinylm with injected faults.

Each trace is a data-parallel run simulated in one process: ``RANKS`` model replicas, each fed
its own micro-batch per step; their gradients are averaged (token-weighted, as an all-reduce of
``loss_sum`` gradients would) and every replica applies the average with its own AdamW — so the
replicas stay bit-identical unless a fault makes one of them differ, exactly as in DDP. Each
rank writes its own telemetry record (the format of docs/sdk.md) with per-source splits, sample
IDs and a parameter fingerprint.

    python -m bench.detection.generate            # all traces (~1-2 min on 2 cores)
    python -m bench.detection.generate bad_batch  # one
    python -m bench.detection.generate --out /tmp/corpus   # elsewhere

Writes ``bench/detection/corpus/<name>.jsonl.gz`` and ``corpus/labels.json``.
"""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import json
import math
import random
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from examples.tinylm.data import TextDataset, build_dataset, collate, stdlib_root
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss

OUT = Path(__file__).parent / "corpus"
RANKS = 4
BATCH = 4  # sequences per rank per step
STEPS = 300
SEQ = 64
BASE_LR = 3e-3
WARMUP = 20
SOURCES = ("code", "docstrings", "tests")
LONG = 3000  # steps of the long runs
#: Model sizes: (d_model, n_layers, n_heads, seq_len). "tiny" is the original corpus; the others check
#: that nothing was tuned to one model's noise: "small" is twice as wide and deep (~8x the compute),
#: "narrow" half as wide on half the sequence length (half the tokens per step: a noisier loss) and
#: cheap enough to generate on a busy 2-core machine.
SIZES = {"tiny": (64, 2, 4, SEQ), "small": (128, 4, 4, SEQ), "narrow": (32, 2, 2, 32)}


@dataclass
class Fault:
    """What to inject, and the label the engine should produce."""

    name: str
    onset: int | None = None  # None: a run that must raise nothing
    phenotype: str | None = None
    cause: str | None = None
    first_rank: int | None = None
    seed: int = 0
    mixture: Callable[[int], dict[str, float]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    size: str = "tiny"
    steps: int = STEPS
    ranks: int = RANKS
    loss_visible: bool = True  # False: the loss alone never shows this fault (scored apart)
    kind: str = ""  # the fault injected (defaults to the name; variants share one injection)

    def __post_init__(self) -> None:
        self.kind = self.kind or self.name

    def label(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "harmful": self.onset is not None,
            "onset": self.onset,
            "phenotype": self.phenotype,
            "cause": self.cause,
            "first_rank": self.first_rank,
            "seed": self.seed,
            "params": self.params,
            "size": self.size,
            "steps": self.steps,
            "ranks": self.ranks,
            "loss_visible": self.loss_visible,
        }


def _uniform(step: int) -> dict[str, float]:
    return {"code": 1 / 3, "docstrings": 1 / 3, "tests": 1 / 3}


def _shift(step: int) -> dict[str, float]:
    """From 180 on, a quarter of each batch comes from a harder domain: base64 blobs (~4.2 nats/byte)."""
    if step < 180:
        return _uniform(step)
    return {"code": 0.25, "docstrings": 0.25, "tests": 0.25, "b64": 0.25}


def _fifth_tests(step: int) -> dict[str, float]:
    """The mix of the bad-source run: `tests` is a fifth of the samples."""
    return {"code": 0.4, "docstrings": 0.4, "tests": 0.2}


def b64_texts(n_files: int = 40) -> dict[str, str]:
    """A real but harder domain: base64 of zlib-compressed stdlib files (as embedded in code and configs)."""
    root = stdlib_root()
    files = sorted(root.glob("*.py"))[:n_files]
    return {f"{p.name}.z.b64": base64.b64encode(zlib.compress(p.read_bytes())).decode() for p in files}


FAULTS = [
    Fault("clean_s0", seed=0),
    Fault("clean_s1", seed=1),
    Fault("clean_s2", seed=2),
    Fault("benign_mixture_shift", seed=3, mixture=_shift),
    Fault("bad_batch", 200, "transient", "data", 1, seed=4, params={"rank": 1}),
    Fault("lr_too_high", 200, "divergence", "optimizer", seed=5, params={"lr_growth": 1.25}),
    Fault("oversized_update", 200, "slow_recovery", "optimizer", seed=6, params={"lr_mult": 60.0}),
    Fault("fp16_overflow", 200, "transient", "numeric", seed=7, params={"module": "blocks.1.mlp"}),
    Fault("rank_corrupt_range", 200, "transient", "data", 2, seed=8, params={"rank": 2, "steps": 12}),
    Fault("periodic_junk_source", 100, "periodic", "data", 0, seed=9, params={"every": 40, "rank": 0}),
    Fault(
        "replica_divergence",
        200,
        "transient",
        "distributed",
        1,
        seed=10,
        params={"rank": 1, "noise": 0.05},
        loss_visible=False,
    ),
    Fault(
        "resume_without_optimizer",
        151,
        "transient",
        "resume_state",
        seed=11,
        params={"crash": 200, "ckpt": 150},
        loss_visible=False,
    ),
    Fault("misreduced_metric", 200, "transient", "metric_artifact", 3, seed=12, params={"rank": 3}),
    # One source (a fifth of the samples) serves random bytes from the onset on, on every rank (its
    # files overwritten upstream): the mixture's loss rises ~10-15% with calm gradients, the source's
    # own loss far beyond its band. It stays until someone keeps the source out.
    Fault(
        "bad_source",
        200,
        "slow_recovery",
        "data",
        seed=14,
        mixture=_fifth_tests,
        params={"source": "tests"},
    ),  # fmt: skip
    # One rank's input corrupted from the onset on, for good (a broken shard or loader on that rank):
    # its loss stays far above the others'. One incident that does not go away: divergence, rank-local.
    Fault(
        "rank_corrupt_persistent",
        150,
        "divergence",
        "data",
        2,
        seed=13,
        kind="rank_corrupt_range",
        params={"rank": 2, "steps": 10**6},
    ),  # fmt: skip
    # Two more model sizes.
    *[
        Fault(f"{base}_{size}", onset, phen, cause, rank, seed=seed, params=params, size=size, kind=base)
        for size in ("small", "narrow")
        for base, onset, phen, cause, rank, seed, params in (
            ("clean", None, None, None, None, 30, {}),
            ("bad_batch", 200, "transient", "data", 1, 31, {"rank": 1}),
            ("oversized_update", 200, "slow_recovery", "optimizer", None, 33, {"lr_mult": 60.0}),
            ("lr_too_high", 200, "divergence", "optimizer", None, 32, {"lr_growth": 1.25}),
        )
    ],
    # Long runs (one rank, to keep generation affordable): a quiet one, a long-period fault, a late divergence.
    Fault("clean_long", seed=40, steps=LONG, ranks=1),
    Fault(
        "periodic_long",
        1000,
        "periodic",
        "data",
        None,
        seed=41,
        steps=LONG,
        ranks=1,
        kind="periodic_junk_source",
        params={"every": 450, "rank": 0},
    ),  # fmt: skip
    Fault(
        "lr_too_high_long",
        2400,
        "divergence",
        "optimizer",
        seed=42,
        steps=LONG,
        ranks=1,
        kind="lr_too_high",
        params={"lr_growth": 1.2},
    ),  # fmt: skip
]


class Run:
    """One simulated data-parallel training run writing per-rank records."""

    def __init__(self, fault: Fault, dataset: TextDataset) -> None:
        self.fault, self.ds = fault, dataset
        torch.manual_seed(fault.seed)
        d_model, n_layers, n_heads, self.seq = SIZES[fault.size]
        cfg = TinyLMConfig(seq_len=self.seq, d_model=d_model, n_layers=n_layers, n_heads=n_heads)
        base = TinyLM(cfg)
        self.models = [copy.deepcopy(base) for _ in range(fault.ranks)]
        self.opts = [self._optimizer(m) for m in self.models]
        self.by_source: dict[str, list[int]] = {s: [] for s in SOURCES}
        for i, c in enumerate(dataset.chunks):
            self.by_source.setdefault(c.source, []).append(i)
        self.records: list[dict[str, Any]] = []
        self.loss_scale = 65536.0

    @staticmethod
    def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=BASE_LR, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_at(self, step: int) -> float:
        if step <= WARMUP:
            return BASE_LR * step / WARMUP
        progress = (step - WARMUP) / (self.fault.steps - WARMUP)
        return BASE_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    # -- data ----------------------------------------------------------------------------
    def batch(self, step: int, rank: int) -> tuple[dict[str, Any], list[str], list[str]]:
        """A rank's micro-batch: seeded by (seed, step, rank), so a replay after resume is identical."""
        rng = random.Random(f"{self.fault.seed}:{step}:{rank}")
        mix = (self.fault.mixture or _uniform)(step)
        names, weights = zip(*mix.items(), strict=True)
        idx = [rng.choice(self.by_source[rng.choices(names, weights)[0]]) for _ in range(BATCH)]
        items = [self.ds[i] for i in idx]
        ids = [self.ds.sample_id(i) for i in idx]
        srcs = [self.ds.source(i) for i in idx]
        if self.fault.kind == "bad_source" and step >= (self.fault.onset or 0):
            for j, src in enumerate(srcs):  # same sample IDs, their content overwritten with bytes
                if src == self.fault.params["source"]:
                    gen = torch.Generator().manual_seed(zlib.crc32(ids[j].encode()))
                    raw = torch.randint(0, 256, (self.seq + 1,), generator=gen)
                    items[j] = {"input_ids": raw[:-1].clone(), "targets": raw[1:].clone(), "length": self.seq}
        junk = self._junk(step, rank)
        if junk:
            gen = torch.Generator().manual_seed(step * 31 + rank)
            for j, it in enumerate(items):
                raw = torch.randint(0, 256, (self.seq + 1,), generator=gen)
                it = {"input_ids": raw[:-1].clone(), "targets": raw[1:].clone(), "length": self.seq}
                items[j] = it
                ids[j] = f"{junk}:{step}:{rank}:{j}"
                srcs[j] = junk
        return collate(items), ids, srcs

    def _junk(self, step: int, rank: int) -> str | None:
        f, p = self.fault, self.fault.params
        if f.kind == "bad_batch" and step == f.onset and rank == p["rank"]:
            return "corrupt"
        if f.kind == "rank_corrupt_range" and f.onset is not None and f.onset <= step < f.onset + p["steps"]:
            return "corrupt" if rank == p["rank"] else None
        if f.kind == "periodic_junk_source" and f.onset is not None and step >= f.onset and rank == p["rank"]:
            return "junk" if (step - f.onset) % p["every"] == 0 else None
        return None

    # -- one step ------------------------------------------------------------------------
    def step(self, step: int, events: list[str]) -> None:
        f, p = self.fault, self.fault.params
        lr = self.lr_at(step)
        if f.kind == "lr_too_high" and step >= (f.onset or 0):
            lr *= p["lr_growth"] ** (step - (f.onset or 0) + 1)  # a warmup that never stops growing
        if f.kind == "oversized_update" and step == f.onset:
            lr *= p["lr_mult"]
        per_rank = []
        for rank, model in enumerate(self.models):
            batch, ids, srcs = self.batch(step, rank)
            hook = self._overflow_hook(model) if f.kind == "fp16_overflow" and step == f.onset else None
            out = lm_loss(model, batch)
            if hook is not None:
                hook.remove()
            per_rank.append((batch, ids, srcs, out))
        total_tokens = float(sum(float(o.tokens) for *_, o in per_rank))
        for (_b, _i, _s, out), model in zip(per_rank, self.models, strict=True):
            model.zero_grad(set_to_none=True)
            (out.loss_sum / total_tokens).backward()
        grads = self._allreduce()
        nonfinite = any(not torch.isfinite(g).all() for g in grads)
        gnorm = float(torch.norm(torch.stack([g.norm() for g in grads]))) if not nonfinite else math.nan
        where = self._first_nonfinite_module(step) if nonfinite else None
        pnorm = self._norm(self.models[0])
        before = [torch.cat([q.detach().flatten() for q in m.parameters()]) for m in self.models]
        if nonfinite:  # an AMP-style scaler skips the step and halves the scale
            self.loss_scale /= 2
        else:
            clip = min(1.0, 1.0 / (gnorm + 1e-6))
            for rank, (model, opt) in enumerate(zip(self.models, self.opts, strict=True)):
                for q, g in zip(model.parameters(), grads, strict=True):
                    q.grad = (g * clip).clone()
                    if f.kind == "replica_divergence" and step == f.onset and rank == p["rank"]:
                        q.grad += p["noise"] * torch.randn_like(g) * (g.abs().mean() + 1e-8) / 1e-3
                for group in opt.param_groups:
                    group["lr"] = lr
                opt.step()
        for rank, ((batch, ids, srcs, out), model) in enumerate(zip(per_rank, self.models, strict=True)):
            after = torch.cat([q.detach().flatten() for q in model.parameters()])
            upd = float((after - before[rank]).norm())
            self.records.append(
                self._record(step, rank, lr, out, batch, ids, srcs, gnorm, pnorm, upd, model, events, where)
            )

    def _record(self, step: int, rank: int, lr: float, out: Any, batch: dict[str, Any], ids: list[str],
                srcs: list[str], gnorm: float, pnorm: float, upd: float, model: torch.nn.Module,
                events: list[str], where: str | None) -> dict[str, Any]:  # fmt: skip
        loss_sum, tokens = float(out.loss_sum.detach()), int(out.tokens)
        loss = loss_sum / max(tokens, 1)
        sample_means = (out.sample_loss_sum / out.sample_tokens.clamp_min(1)).tolist()
        f = self.fault
        if f.kind == "misreduced_metric" and step == f.onset and rank == f.params["rank"]:
            loss = loss_sum / BATCH  # a reduction bug: summed over tokens, averaged over sequences
        sources: dict[str, dict[str, float]] = {}
        for s, ls, tk in zip(srcs, out.sample_loss_sum.tolist(), out.sample_tokens.tolist(), strict=True):
            acc = sources.setdefault(s, {"tokens": 0, "loss_sum": 0.0})
            acc["tokens"] += int(tk)
            acc["loss_sum"] += float(ls)
        lengths = batch["lengths"]
        rec: dict[str, Any] = {
            "step": step, "rank": rank, "world_size": self.fault.ranks, "loss": loss, "loss_sum": loss_sum, "tokens": tokens,
            "batch_mean_loss": sum(sample_means) / len(sample_means), "lr": lr, "grad_norm": gnorm,
            "param_norm": pnorm, "update_norm": upd, "loss_scale": self.loss_scale,
            "overflow": bool(where), "sources": sources, "samples": ids,
            "seq_len_max": max(lengths), "seq_len_mean": sum(lengths) / len(lengths),
            "param_checksum": _fingerprint(model), "events": list(events),
        }  # fmt: skip
        if where:
            rec["nonfinite"], rec["nonfinite_at"] = True, where
        return rec

    def _allreduce(self) -> list[torch.Tensor]:
        params = [list(m.parameters()) for m in self.models]
        return [sum(ps[i].grad for ps in params) for i in range(len(params[0]))]  # type: ignore[misc]

    def _overflow_hook(self, model: torch.nn.Module) -> Any:
        module = model.get_submodule(self.fault.params["module"])
        return module.register_forward_hook(lambda _m, _i, o: o * 1e38 * 1e38)  # fp16-style overflow -> inf

    def _first_nonfinite_module(self, step: int) -> str | None:
        """Re-run rank 0's forward with hooks: the first module whose output is not finite."""
        model, found = self.models[0], []
        # The injected overflow is registered first so the checking hooks see its output.
        extra = self._overflow_hook(model) if self.fault.kind == "fp16_overflow" else None
        hooks = [
            m.register_forward_hook(
                lambda mod, _i, o, n=n: found.append(n) if not torch.isfinite(o).all() else None
            )
            for n, m in model.named_modules()
            if n
        ]
        with torch.no_grad():
            lm_loss(model, self.batch(step, 0)[0])
        for h in hooks + ([extra] if extra else []):
            h.remove()
        return found[0] if found else "loss"

    @staticmethod
    def _norm(model: torch.nn.Module) -> float:
        return float(torch.norm(torch.stack([q.detach().norm() for q in model.parameters()])))

    # -- the run -------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        f, p = self.fault, self.fault.params
        if f.kind != "resume_without_optimizer":
            for step in range(1, f.steps + 1):
                self.step(step, ["checkpoint_saved"] if step % 50 == 0 else [])
            return self.records
        ckpt = None
        for step in range(1, p["crash"] + 1):
            self.step(step, ["checkpoint_saved"] if step % 50 == 0 else [])
            if step == p["ckpt"]:
                ckpt = [copy.deepcopy(m.state_dict()) for m in self.models]
        assert ckpt is not None
        for m, sd in zip(self.models, ckpt, strict=True):  # model restored, optimizer state lost
            m.load_state_dict(sd)
        self.opts = [self._optimizer(m) for m in self.models]
        for step in range(p["ckpt"] + 1, f.steps + 1):
            self.step(step, ["resumed"] if step == p["ckpt"] + 1 else [])
        return self.records


def _fingerprint(model: torch.nn.Module) -> str:
    flat = torch.cat([q.detach().flatten() for q in model.parameters()])
    return hashlib.sha1(flat.numpy().tobytes()).hexdigest()[:16]


def main(argv: list[str]) -> None:
    out = OUT
    if argv[:1] == ["--out"]:
        out, argv = Path(argv[1]), argv[2:]
    names = argv
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    datasets: dict[int, TextDataset] = {}
    labels_path = out / "labels.json"
    labels = json.loads(labels_path.read_text()) if labels_path.exists() else {}
    for fault in FAULTS:
        if names and fault.name not in names:
            continue
        seq = SIZES[fault.size][3]
        if seq not in datasets:
            datasets[seq] = build_dataset(seq, 300_000, 0, extra_texts={"b64": b64_texts()})
        records = Run(fault, datasets[seq]).run()
        with gzip.open(out / f"{fault.name}.jsonl.gz", "wt", compresslevel=9) as fh:
            for rec in records:
                fh.write(json.dumps(_round(rec)) + "\n")
        labels[fault.name] = fault.label()
        print(f"{fault.name}: {len(records)} records", flush=True)
    labels_path.write_text(json.dumps(dict(sorted(labels.items())), indent=1) + "\n")


def _round(rec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in rec.items():
        out[k] = float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v
    for s in out.get("sources", {}).values():
        s["loss_sum"] = float(f"{s['loss_sum']:.6g}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
