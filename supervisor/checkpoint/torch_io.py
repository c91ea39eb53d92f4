"""torch file I/O for checkpoints: saving, mmap loading, RNG state, and the loadable check.

Kept apart from training_state.py (the save / restore protocol) so the choices measured in
bench/README.md sit in one place: torch's own CRC32 off (the store checksums every file),
mmap loads, and single-threaded copies out of the mmap.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from supervisor.errors import CheckpointError

try:
    from torch.utils.serialization import config as _serialization_config
except ImportError:  # torch < 2.6
    _serialization_config = None  # type: ignore[assignment]


def save_file(obj: Any, f: BinaryIO) -> None:
    """torch.save without torch's own per-record CRC32 (see ``crc_off``)."""
    with crc_off():
        torch.save(obj, f)


@contextmanager
def crc_off() -> Iterator[None]:
    """torch.save (and DCP, which torch.saves each record) without torch's own per-record CRC32:
    the store checksums every file already, and torch's CRC (miniz, ~1 GB/s) was the largest
    cost of a save (bench/README.md). A process-wide torch setting, put back on exit."""
    save_config = getattr(_serialization_config, "save", None)
    if save_config is None or not hasattr(save_config, "compute_crc32"):  # older torch: always computes it
        yield
        return
    previous = save_config.compute_crc32
    save_config.compute_crc32 = False
    try:
        yield
    finally:
        save_config.compute_crc32 = previous


def load_mmap(path: Path, map_location: str | torch.device) -> Any:
    # mmap: the bytes are copied once, page cache -> live tensor, by load_state_dict (no read buffer,
    # so none of the slow unaligned-destination reads).
    try:
        return torch.load(path, map_location=map_location, mmap=True, weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path.name}: cannot load: {type(exc).__name__}: {exc}") from None


@contextmanager
def one_thread() -> Iterator[None]:
    """Copies out of an mmap on one thread: several threads faulting the same mapping in
    contend for it and ran ~1.4x slower than one (bench/README.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def capture_rng() -> dict[str, Any]:
    """Every RNG a training step may draw from. Mersenne-Twister words are stored as int64
    tensors: a list of 624 ints costs the weights-only unpickler ~100x more to read."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy MT19937 tuple
    version, words, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": (version, torch.tensor(words, dtype=torch.int64), gauss),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> list[str]:
    events = []
    version, words, gauss = state["python"]
    random.setstate((version, tuple(int(w) for w in words.tolist()), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        saved = state["cuda"]
        if len(saved) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(saved)
        else:
            events.append(
                f"cuda rng not restored: saved for {len(saved)} devices, {torch.cuda.device_count()} here"
            )
    elif "cuda" in state:
        events.append("cuda rng saved but no CUDA device here: not restored")
    return events


def check_loadable(path: Path) -> str | None:
    """None when torch can open the file (mmap, weights only: cheap), else why not."""
    try:
        torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # any failure to open is the answer, not a crash
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None
