"""A small causal transformer LM over bytes (vocab 256: no tokenizer, nothing to download).

Pre-LN blocks with ``scaled_dot_product_attention`` (causal), a GELU MLP and a head tied to
the token embedding. Sizes are set by ``TinyLMConfig``; the defaults train at tens of steps
per second on a laptop CPU, which is what the tests and drills need.

    model = TinyLM(TinyLMConfig(d_model=64, n_layers=2))
    out = lm_loss(model, batch)          # StepLoss: loss_sum, tokens, per-sample sums
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from supervisor.sdk.losses import StepLoss, token_losses


@dataclass(frozen=True)
class TinyLMConfig:
    vocab_size: int = 256
    """Byte-level vocabulary."""
    seq_len: int = 64
    """Maximum context (positions) the model accepts."""
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    """Dropout after attention and MLP (0 keeps replays bit-identical without RNG care)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TinyLMConfig:
        known = {k: v for k, v in (d or {}).items() if k in asdict(cls())}
        return cls(**known)


class Attention(nn.Module):
    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model ({cfg.d_model}) must be divisible by n_heads ({cfg.n_heads})")
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.out = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyLM(nn.Module):
    """Token + learned position embedding, ``n_layers`` pre-LN blocks, final LN, tied head."""

    def __init__(self, cfg: TinyLMConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or TinyLMConfig()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2 style scaled init of residual projections
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, time, vocab]`` for byte ids ``[batch, time]``."""
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len {self.cfg.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def lm_loss(model: nn.Module, batch: dict[str, Any]) -> StepLoss:
    """Next-byte cross-entropy of ``batch`` (from ``examples.tinylm.data``): sums, not means."""
    logits = model(batch["input_ids"])
    return token_losses(logits, batch["targets"])
