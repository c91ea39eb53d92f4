"""A plain torchrun-style training script: the tiny byte-level LM on the Python stdlib's source.

It owns everything a real script owns — ``init_process_group()`` from the environment, DDP,
a ``DistributedSampler``, AdamW, warmup + cosine, ``clip_grad_norm_``, its own checkpoints
and prints — and runs unchanged three ways (from the repository root)::

    python -m examples.torchrun.train --steps 200
    torchrun --nproc_per_node 2 -m examples.torchrun.train --steps 200
    supervisor launch examples/torchrun/job.yaml        # one process per rank, supervised

The lines marked ``# supervisor`` are all it takes: ``sdk.watch`` hooks the optimizer and
``probe.record`` reports each step. ``--supervised-loader`` draws the batches from the SDK's
``SupervisedLoader`` instead of a ``DistributedSampler`` (records name samples and sources, and
the policy's exclusions and skips work). Without a supervisor the probe writes a local trace
(``--trace``, one file per rank) that ``supervisor analyze`` reads.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from examples.tinylm.data import build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig
from supervisor import sdk  # supervisor
from supervisor.integrations.drills import inject_faults  # drills: job.yaml `faults:` (no-op otherwise)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--data-bytes", type=int, default=300_000, help="Bytes of text per source.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-dir", default=None, help="The script's own checkpoints (rank 0).")
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument(
        "--supervised-loader",
        action="store_true",
        help="Draw batches from sdk.SupervisedLoader (sample IDs and sources in the records, exclusions).",
    )
    ap.add_argument(
        "--trace",
        default=None,
        help="Offline trace (no supervisor); default: $SUPERVISOR_TRACE, else supervisor_trace.jsonl, .rank<N> added per rank.",
    )
    return ap.parse_args()


def main() -> None:
    args = parse()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(args.seed)
    model: torch.nn.Module = TinyLM(
        TinyLMConfig(d_model=args.d_model, n_layers=args.layers, seq_len=args.seq_len)
    )
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def schedule(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    dataset = build_dataset(args.seq_len, args.data_bytes, args.seed)

    def train_step(batch: dict[str, Any]) -> tuple[sdk.StepLoss, torch.Tensor]:
        out = sdk.token_losses(model(batch["input_ids"]), batch["targets"])  # per-sample token-loss sums
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return out, grad_norm

    def after_step(step: int, out: sdk.StepLoss) -> None:
        if rank == 0 and step % args.log_every == 0:
            print(f"step {step} loss {out.loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}", flush=True)
        if args.save_dir and rank == 0 and step % args.save_every == 0:
            Path(args.save_dir).mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "step": step}, Path(args.save_dir) / f"step{step}.pt")

    if args.supervised_loader:
        # supervisor: the SDK's loader (it shards the global batch over the ranks itself). The step
        # boundary runs inside it and it ends at max_steps; records name each step's samples and
        # sources, and the policy's exclusions and skips are carried out.
        supervised = sdk.SupervisedLoader(dataset, args.batch_size, seed=args.seed, collate_fn=collate)
        probe = sdk.watch(
            model, optimizer, scheduler=scheduler, loader=supervised, trace=args.trace, max_steps=args.steps
        )  # supervisor (a restarted process resumes here: model, optimizer, scheduler and data cursor)
        inject_faults(probe)  # drills
        for batch in supervised:
            out, grad_norm = train_step(batch)
            probe.record(out, grad_norm=grad_norm)  # supervisor: per-sample sums give per-source losses
            after_step(probe.step_count, out)
        supervised.close()
    else:
        sampler = DistributedSampler(dataset, seed=args.seed) if distributed else None
        loader = DataLoader(dataset, args.batch_size, sampler=sampler, shuffle=sampler is None,
                            collate_fn=collate, drop_last=True)  # fmt: skip
        probe = sdk.watch(
            model, optimizer, scheduler=scheduler, trace=args.trace, max_steps=args.steps
        )  # supervisor
        inject_faults(probe)  # drills
        step, epoch = probe.step_count, probe.step_count  # a supervised restart resumes at the probe's step
        while step < args.steps:
            if sampler is not None:
                sampler.set_epoch(epoch)
            epoch += 1
            for batch in loader:
                if not probe.proceed():  # supervisor: step boundary (directives, checkpoints, stop)
                    step = args.steps
                    break
                out, grad_norm = train_step(batch)
                probe.record(out, grad_norm=grad_norm)  # supervisor
                step = probe.step_count  # supervisor: the kept timeline's step (a rollback moves it back)
                after_step(step, out)
    probe.close()  # supervisor
    if rank == 0:
        print(f"done at step {probe.step_count}", flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
