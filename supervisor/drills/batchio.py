"""Reading and rewriting a training batch without knowing its exact type.

A batch may be a token tensor, a tuple/list of tensors, a mapping, or a dataclass. Its
*token tensors* are the 2-D integer tensors in it (inputs, targets); rows are samples.
Optional per-row labels come from mapping keys / attributes ``sample_ids`` (or ``samples``)
and ``sources``. Rewrites return a new batch and never modify the loader's tensors in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

_ID_KEYS = ("sample_ids", "samples", "ids")
_SOURCE_KEYS = ("sources", "source")


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts; identical across processes (unlike ``hash``)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def _fields(batch: Any) -> dict[str, Any] | None:
    if isinstance(batch, Mapping):
        return dict(batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return None


def _labels(batch: Any, keys: tuple[str, ...]) -> list[str] | None:
    fields = _fields(batch)
    if fields is None:
        return None
    for key in keys:
        value = fields.get(key)
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            return [str(v) for v in value]
    return None


def sample_ids(batch: Any) -> list[str] | None:
    return _labels(batch, _ID_KEYS)


def source_labels(batch: Any) -> list[str] | None:
    return _labels(batch, _SOURCE_KEYS)


def _is_tokens(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 2
        and not value.is_floating_point()
        and value.dtype != torch.bool
    )


def token_tensors(batch: Any) -> list[torch.Tensor]:
    """The 2-D integer tensors of the batch, in a stable order."""
    if _is_tokens(batch):
        return [batch]
    fields = _fields(batch)
    values = (
        list(fields.values())
        if fields is not None
        else list(batch)
        if isinstance(batch, list | tuple)
        else []
    )
    return [v for v in values if _is_tokens(v)]


def num_rows(batch: Any) -> int:
    tensors = token_tensors(batch)
    return int(tensors[0].shape[0]) if tensors else 0


def max_token(batch: Any) -> int:
    return max((int(t.max()) for t in token_tensors(batch) if t.numel()), default=0)


def garbage_rows(batch: Any, rows: Sequence[int], vocab: int, seeds: Sequence[int]) -> Any:
    """A copy of ``batch`` whose token tensors hold uniformly random tokens in ``rows``.

    Negative entries (ignore-index masks on targets) are kept, so the token count is unchanged.
    ``seeds[i]`` seeds row ``rows[i]``, so the same sample turns into the same garbage on replay.
    Inputs and targets get independent noise (a copy task would be learnable, not garbage).
    """
    if not rows:
        return batch
    counter = iter(range(1 << 30))

    def rewrite(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        k = next(counter)
        for row, seed in zip(rows, seeds, strict=True):
            gen = torch.Generator().manual_seed(stable_seed(seed, k))
            noise = torch.randint(0, vocab, (t.shape[1],), generator=gen, dtype=t.dtype).to(t.device)
            out[row] = torch.where(t[row] < 0, t[row], noise)  # masked positions (-100) stay masked
        return out

    return map_tokens(batch, rewrite)


def map_tokens(batch: Any, fn: Any) -> Any:
    """Apply ``fn`` to every token tensor, keeping the container type."""
    if _is_tokens(batch):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: fn(v) if _is_tokens(v) else v for k, v in batch.items()})  # type: ignore[call-arg]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {
            f.name: fn(getattr(batch, f.name))
            for f in dataclasses.fields(batch)
            if _is_tokens(getattr(batch, f.name))
        }
        return dataclasses.replace(batch, **changes)
    if isinstance(batch, list | tuple):
        items = [fn(v) if _is_tokens(v) else v for v in batch]
        return type(batch)(items) if isinstance(batch, list) or type(batch) is tuple else type(batch)(*items)
    return batch
