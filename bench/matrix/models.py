"""Three model families over token sequences, none of them the tuned-on TinyLM.

- ``gru``: a GRU language model (embedding, 1-layer GRU, linear head);
- ``encoder``: ``nn.TransformerEncoder`` with a causal mask (post-LN, ReLU: torch's defaults,
  unlike TinyLM's pre-LN GELU blocks and tied head);
- ``convnet``: a causal dilated 1-D CNN (left-padded convolutions, residual, GELU).

All map ``input_ids [B, T]`` to logits ``[B, T, V]``; ``token_loss`` gives the SDK's
token-weighted ``StepLoss`` (padding targets are ``-100``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from supervisor.sdk.losses import StepLoss, token_losses


class GRULM(nn.Module):
    def __init__(self, vocab: int, d: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(idx))
        return self.head(out)


class EncoderLM(nn.Module):
    def __init__(self, vocab: int, d: int = 64, layers: int = 2, heads: int = 4, seq_len: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq_len, d))
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        x = self.emb(idx) + self.pos[:t]
        return self.head(self.enc(x, mask=mask, is_causal=True))


class ConvLM(nn.Module):
    def __init__(self, vocab: int, d: int = 64, layers: int = 3, kernel: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.convs = nn.ModuleList(nn.Conv1d(d, d, kernel, dilation=2**i) for i in range(layers))
        self.pads = [(kernel - 1) * 2**i for i in range(layers)]
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx).transpose(1, 2)  # [B, d, T]
        for conv, pad in zip(self.convs, self.pads, strict=True):
            x = x + F.gelu(conv(F.pad(x, (pad, 0))))  # left padding: causal
        return self.head(x.transpose(1, 2))


FAMILIES = ("gru", "encoder", "convnet")


def build_model(family: str, vocab: int, seq_len: int, d: int = 64) -> nn.Module:
    if family == "gru":
        return GRULM(vocab, d)
    if family == "encoder":
        return EncoderLM(vocab, d, seq_len=seq_len)
    if family == "convnet":
        return ConvLM(vocab, d)
    raise ValueError(f"unknown family {family!r} (valid: {', '.join(FAMILIES)})")


def token_loss(model: nn.Module, batch: dict[str, Any]) -> StepLoss:
    return token_losses(model(batch["input_ids"]), batch["targets"])
