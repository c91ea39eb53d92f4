"""Data for the matrix: real text (the stdlib corpus of examples/tinylm) or synthetic sequences.

The synthetic corpus has three named sources, generated from a seed (nothing on disk):
``arith`` (``17+5=22;`` sums), ``markov`` (a sparse order-1 Markov chain over 24 letters)
and ``motif`` (random 3-7 letter motifs repeated). It goes through the same ``TextDataset``
as real text, so sample IDs, sources, padding and ``collate`` are the SDK-facing protocol
every job here shares.
"""

from __future__ import annotations

import random

from examples.tinylm.data import TextDataset, build_dataset

LETTERS = "abcdefghijklmnopqrstuvwx"


def _arith(rng: random.Random, n: int) -> str:
    parts = []
    while sum(map(len, parts)) < n:
        a, b = rng.randrange(100), rng.randrange(100)
        parts.append(f"{a}+{b}={a + b};")
    return "".join(parts)


def _markov(rng: random.Random, n: int) -> str:
    nxt = {c: rng.sample(LETTERS, 3) for c in LETTERS}
    c, out = "a", []
    for _ in range(n):
        c = rng.choice(nxt[c])
        out.append(c)
    return "".join(out)


def _motif(rng: random.Random, n: int) -> str:
    out = []
    while sum(map(len, out)) < n:
        motif = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 7)))
        out.append(motif * rng.randint(3, 6) + " ")
    return "".join(out)


def synthetic_texts(bytes_per_source: int, seed: int) -> dict[str, dict[str, str]]:
    rng = random.Random(seed)
    per_doc = 4096
    docs = max(1, bytes_per_source // per_doc)
    return {
        name: {f"doc{i:04d}": make(rng, per_doc) for i in range(docs)}
        for name, make in (("arith", _arith), ("markov", _markov), ("motif", _motif))
    }


def extra_source(bytes_: int, seed: int) -> dict[str, str]:
    """An extra source of ``bytes_`` (Markov text and sums): the one that turns bad in a drill."""
    rng = random.Random(seed + 7)
    return {
        f"page{i:03d}": _markov(rng, 2048) + " " + _arith(rng, 2048) for i in range(max(1, bytes_ // 4096))
    }


def build(kind: str, seq_len: int, bytes_per_source: int, seed: int, extra: str | None = None) -> TextDataset:
    """``extra`` names an additional source (``extra_source``) as large as the three others
    together: half of the samples, as web text is in most pretraining mixtures."""
    more = {extra: extra_source(bytes_per_source * 3, seed)} if extra else {}
    if kind == "synthetic":
        return TextDataset({**synthetic_texts(bytes_per_source, seed), **more}, seq_len)
    if kind == "stdlib":
        return build_dataset(seq_len, bytes_per_source, seed, extra_texts=more)
    raise ValueError(f"unknown data {kind!r} (valid: stdlib, synthetic)")
