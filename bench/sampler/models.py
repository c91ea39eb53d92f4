"""Six model families over byte sequences, written from scratch as a new user would.

- ``llama``: decoder with RMSNorm, SwiGLU MLP, rotary position embeddings, tied embeddings, no biases;
- ``gpt2``: decoder with learned positions, pre-LayerNorm, GELU MLP (4x), tied head;
- ``moe``: a mixture-of-experts MLP LM: causal token mixing (a depthwise causal convolution), then
  a router picking the top-2 of 4 expert MLPs per token (softmax over the chosen two);
- ``lstm``: a 1-layer LSTM LM (the recurrence runs in fp32 under autocast: CPU fp16 has no LSTM kernel);
- ``cnn``: causal depthwise-separable 1-D convolutions (ConvMixer-style), residual, BatchNorm-free;
- ``mlp``: a fixed-window next-byte MLP (the embeddings of the last 8 bytes concatenated).

All map ``input_ids [B, T]`` to logits ``[B, T, V]``; ``token_loss`` gives the SDK's
token-weighted ``StepLoss`` (padding targets are ``-100``). ``bench.sampler.space.OVERFLOW_MODULE``
names, per family, a module every forward runs (as the probe sees it under DDP): where the
`nan_rank` fault makes one rank's activations overflow.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from supervisor.sdk.losses import StepLoss, token_losses


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding of ``x [B, H, T, Dh]`` (pairs of the last dim rotated by position)."""
    t, dh = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, dh, 2, device=x.device, dtype=torch.float32) / dh)
    ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, rope: bool, bias: bool) -> None:
        super().__init__()
        self.heads, self.rope = heads, rope
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.out = nn.Linear(d, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.rope:
            q, k = rotary(q), rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.attn = Attention(d, heads, rope=True, bias=False)
        self.mlp = SwiGLU(d, 8 * d // 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LlamaLM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads) for _ in range(layers))
        self.norm = RMSNorm(d)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.emb.weight.t()  # tied embeddings


class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, rope=False, bias=True)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT2LM(nn.Module):
    def __init__(self, vocab: int, d: int, seq_len: int, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(GPT2Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for emb in (self.wte, self.wpe):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


class MoE(nn.Module):
    """Top-k routed expert MLPs; each token's output is the gate-weighted sum of its k experts.

    Every expert runs on every step, also on an empty token set when the router sent it none:
    its parameters then get a zero gradient instead of none. Under DDP a parameter without a
    gradient leaves its bucket's all-reduce unlaunched on that rank alone, so the ranks part in
    different collectives (the peer blocks in backward, this rank in the next collective: a hang),
    and the rank's local gradient is applied unreduced.
    """

    def __init__(self, d: int, experts: int = 4, k: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d)) for _ in range(experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(flat).topk(self.k, dim=-1)
        weights = weights.float().softmax(dim=-1)
        out = torch.zeros_like(flat, dtype=torch.float32)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            y = expert(flat[token]).float() * weights[token, slot, None]  # no tokens: zero rows
            out = out.index_add(0, token, y)
        return out.to(x.dtype).view_as(x)


class MoELM(nn.Module):
    def __init__(self, vocab: int, d: int, window: int = 4) -> None:
        super().__init__()
        self.window = window
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Conv1d(d, d, window, groups=d)
        self.inp = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.moe = MoE(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        x = x + self.mix(F.pad(x.transpose(1, 2), (self.window - 1, 0))).transpose(1, 2)  # causal
        x = F.gelu(self.inp(x))
        x = x + self.moe(self.norm(x))
        return self.head(x)


class LSTMLM(nn.Module):
    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        with torch.autocast(idx.device.type, enabled=False):  # no fp16 LSTM kernel on CPU
            out, _ = self.rnn(self.emb(idx).float())
        return self.head(out)


class CNNLM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int = 3, kernel: int = 5) -> None:
        super().__init__()
        self.kernel = kernel
        self.emb = nn.Embedding(vocab, d)
        self.depth = nn.ModuleList(nn.Conv1d(d, d, kernel, groups=d) for _ in range(layers))
        self.point = nn.ModuleList(nn.Conv1d(d, d, 1) for _ in range(layers))
        self.proj = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx).transpose(1, 2)
        for depth, point in zip(self.depth, self.point, strict=True):
            x = x + point(F.gelu(depth(F.pad(x, (self.kernel - 1, 0)))))
        return self.head(F.gelu(self.proj(x.transpose(1, 2))))


class WindowMLP(nn.Module):
    def __init__(self, vocab: int, d: int, window: int = 8, hidden: int = 128) -> None:
        super().__init__()
        self.window = window
        self.emb = nn.Embedding(vocab, d // 2)
        self.fc1 = nn.Linear(window * (d // 2), hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        e = F.pad(self.emb(idx).transpose(1, 2), (self.window - 1, 0))  # [B, d/2, T + w - 1]
        ctx = e.unfold(2, self.window, 1)  # [B, d/2, T, w]: the last w bytes of each position
        x = ctx.permute(0, 2, 3, 1).flatten(2)
        x = F.gelu(self.fc1(x))
        return self.head(x + F.gelu(self.fc2(x)))


FAMILIES = ("llama", "gpt2", "moe", "lstm", "cnn", "mlp")


def build_model(family: str, vocab: int, seq_len: int, d: int = 32) -> nn.Module:
    if family == "llama":
        return LlamaLM(vocab, d)
    if family == "gpt2":
        return GPT2LM(vocab, d, seq_len)
    if family == "moe":
        return MoELM(vocab, d)
    if family == "lstm":
        return LSTMLM(vocab, d)
    if family == "cnn":
        return CNNLM(vocab, d)
    if family == "mlp":
        return WindowMLP(vocab, d)
    raise ValueError(f"unknown family {family!r} (valid: {', '.join(FAMILIES)})")


def token_loss(model: nn.Module, batch: dict[str, Any]) -> StepLoss:
    return token_losses(model(batch["input_ids"]), batch["targets"])


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
