"""A Lightning job: the tiny byte-level LM on the Python stdlib's source as a LightningModule.
The supervisor's part is the loader and one callback (``# supervisor``).

    python -m examples.lightning.train --steps 200
    torchrun --nproc_per_node 2 -m examples.lightning.train --steps 200
    supervisor launch examples/lightning/job.yaml
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from examples.tinylm.data import build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig
from supervisor.integrations.lightning import (  # supervisor
    SupervisedLoader,
    SupervisorCallback,
    resume_checkpoint,
)


class LitLM(pl.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.model = TinyLM(TinyLMConfig(d_model=args.d_model, n_layers=args.layers, seq_len=args.seq_len))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        logits = self.model(batch["input_ids"])
        targets = batch["targets"]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        return {"loss": loss, "tokens": (targets != -100).sum()}

    def configure_optimizers(self) -> Any:
        a = self.args
        opt = torch.optim.AdamW(self.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)

        def schedule(step: int) -> float:
            if step < a.warmup:
                return (step + 1) / a.warmup
            progress = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--data-bytes", type=int, default=300_000, help="Bytes of text per source.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--trace",
        default=None,
        help="Offline trace (no supervisor); default: $SUPERVISOR_TRACE, else supervisor_trace.jsonl, .rank<N> added per rank.",
    )
    ap.add_argument("--save-every", type=int, default=0, help="ModelCheckpoint every N steps (0: none).")
    ap.add_argument("--ckpt-dir", default="runs/lightning/ckpt", help="Where ModelCheckpoint writes.")
    return ap.parse_args()


def main() -> None:
    args = parse()
    pl.seed_everything(args.seed, verbose=False)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    # supervisor: the SDK's SupervisedLoader (sample IDs, exclusions, skips, a resumable cursor) in place
    # of torch's DataLoader; it shards each global batch over the ranks itself.
    loader = SupervisedLoader(
        build_dataset(args.seq_len, args.data_bytes, args.seed), batch_size=args.batch_size, seed=args.seed,
        collate_fn=collate,
    )  # fmt: skip
    saves = (
        [ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.save_every, save_top_k=-1)]
        if args.save_every
        else []
    )
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="cpu", strategy="ddp" if distributed else "auto",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        gradient_clip_val=1.0, enable_checkpointing=bool(args.save_every), logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[SupervisorCallback(trace=args.trace), *saves],  # supervisor
    )  # fmt: skip
    trainer.fit(LitLM(args), loader, ckpt_path=resume_checkpoint())  # supervisor: a restart resumes here


if __name__ == "__main__":
    main()
