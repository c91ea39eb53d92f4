"""Token-weighted loss pieces: what the probe needs to report a loss that is not an artifact.

A batch-mean of per-sample means and a token-weighted mean differ when lengths vary; the
record carries both (``loss`` and ``batch_mean_loss``) so the analysis can tell a real
spike from a reduction artifact. ``token_losses`` returns sums so nothing is averaged twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class StepLoss:
    """Sums over one batch (tensors stay on the device: no host sync here)."""

    loss_sum: torch.Tensor
    """Sum of token losses (scalar)."""
    tokens: torch.Tensor
    """Number of unmasked target tokens (scalar)."""
    sample_loss_sum: torch.Tensor | None = None
    """Per-sample sums of token losses, ``[batch]``."""
    sample_tokens: torch.Tensor | None = None
    """Per-sample unmasked token counts, ``[batch]``."""

    @property
    def loss(self) -> torch.Tensor:
        """Token-weighted mean: the quantity to call ``backward`` on."""
        return self.loss_sum / self.tokens.clamp_min(1)


def token_losses(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> StepLoss:
    """Cross-entropy sums of ``logits [B, T, V]`` against ``targets [B, T]`` (``ignore_index`` masked)."""
    per_token = F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index, reduction="none"
    ).view(targets.shape)
    mask = targets != ignore_index
    sample_loss_sum = (per_token * mask).sum(dim=1)
    sample_tokens = mask.sum(dim=1)
    return StepLoss(sample_loss_sum.sum(), sample_tokens.sum(), sample_loss_sum, sample_tokens)
