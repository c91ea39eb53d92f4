"""A Hugging Face ``Trainer`` job: a tiny GPT-2 built from a config (no download), byte-level
tokens of the Python stdlib's source. The supervisor's part is ``SupervisedTrainer`` and
one callback (``# supervisor``).

    python -m examples.hf_trainer.train --steps 200
    torchrun --nproc_per_node 2 -m examples.hf_trainer.train --steps 200
    supervisor launch examples/hf_trainer/job.yaml
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from examples.tinylm.data import build_dataset
from supervisor.integrations.hf import SupervisedTrainer, SupervisorCallback, resume_checkpoint  # supervisor


class ByteLM(torch.utils.data.Dataset[dict[str, Any]]):
    """The tinylm byte chunks as Trainer inputs: ``input_ids`` and ``labels`` (padding = -100)."""

    def __init__(self, seq_len: int, data_bytes: int, seed: int) -> None:
        self.ds = build_dataset(seq_len, data_bytes, seed)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = self.ds[i]
        ids, targets = item["input_ids"], item["targets"]
        labels = torch.cat([ids[:1], targets[:-1]])  # the model shifts labels itself
        return {"input_ids": ids, "labels": labels}

    def sample_id(self, i: int) -> str:  # stable IDs and sources for the records (SupervisedTrainer)
        return self.ds.sample_id(i)

    def source(self, i: int) -> str:
        return self.ds.source(i)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--data-bytes", type=int, default=300_000, help="Bytes of text per source.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default="runs/hf_trainer/out")
    ap.add_argument("--save-every", type=int, default=0, help="Trainer checkpoints every N steps (0: none).")
    ap.add_argument(
        "--trace",
        default=None,
        help="Offline trace (no supervisor); default: $SUPERVISOR_TRACE, else supervisor_trace.jsonl, .rank<N> added per rank.",
    )
    return ap.parse_args()


def main() -> None:
    args = parse()
    torch.manual_seed(args.seed)
    config = GPT2Config(vocab_size=256, n_positions=args.seq_len, n_embd=args.d_model, n_layer=args.layers,
                        n_head=4, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_steps=20, lr_scheduler_type="cosine", weight_decay=0.1,
        adam_beta2=0.95, max_grad_norm=1.0, logging_steps=50, report_to=[],
        save_strategy="steps" if args.save_every else "no", save_steps=args.save_every or 500,
        use_cpu=True, ddp_find_unused_parameters=False, ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None, seed=args.seed, dataloader_drop_last=True, disable_tqdm=True,
    )  # fmt: skip
    dataset = ByteLM(args.seq_len, args.data_bytes, args.seed)
    # supervisor: SupervisedTrainer is a Trainer whose batches come from the SDK's SupervisedLoader
    # (sample IDs in the records; the policy's exclusions and skips are carried out)
    trainer = SupervisedTrainer(
        model=model, args=training, train_dataset=dataset, callbacks=[SupervisorCallback(trace=args.trace)]
    )
    trainer.train(resume_from_checkpoint=resume_checkpoint())  # supervisor: a restart resumes here


if __name__ == "__main__":
    main()
