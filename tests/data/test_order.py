"""The constant-memory order and the exclusion set, one behaviour each."""

from __future__ import annotations

import numpy as np
import pytest

from supervisor.sdk.data.exclusions import ExclusionSet
from supervisor.sdk.data.order import Permutation
from supervisor.sdk.directives import Exclusions


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 1000, 4099, 65537])
def test_permutation_is_a_bijection(n):
    perm = Permutation(n, seed=7, epoch=3)
    got = np.concatenate([perm.block(s, 1000) for s in range(0, n, 1000)])
    assert sorted(got.tolist()) == list(range(n))


def test_order_depends_on_seed_and_epoch_only():
    a, b = Permutation(10_000, 1, 0).block(0, 500), Permutation(10_000, 1, 0).block(0, 500)
    assert a.tolist() == b.tolist()  # any rank, any process: no communication needed
    assert a.tolist() != Permutation(10_000, 1, 1).block(0, 500).tolist()
    assert a.tolist() != Permutation(10_000, 2, 0).block(0, 500).tolist()
    assert Permutation(50, 1, 0, shuffle=False).block(0, 50).tolist() == list(range(50))


def test_block_matches_single_lookups_and_shuffles():
    perm = Permutation(1_000, 0, 0)
    assert [perm[i] for i in range(100, 110)] == perm.block(100, 10).tolist()
    assert perm.block(0, 1_000).tolist() != list(range(1_000))
    with pytest.raises(IndexError):
        perm[1_000]


def test_billion_sample_space_needs_no_table():
    perm = Permutation(10**9, seed=0, epoch=0)
    block = perm.block(999_999_000, 5_000)  # clipped at n
    assert len(block) == 1_000 and len(set(block.tolist())) == 1_000
    assert block.min() >= 0 and block.max() < 10**9


def test_exclusion_set_membership_and_ranges():
    ex = ExclusionSet()
    assert not ex and ex.add(Exclusions(samples=("a",), batch_ranges=((3, 5), (10, 12))))
    assert ex.add(Exclusions(sources=("web",), batch_ranges=((6, 7),)))
    assert not ex.add(Exclusions(samples=("a",)))  # nothing new
    assert not ex.allows("a", "code") and not ex.allows("b", "web") and ex.allows("b", "code")
    assert [i for i in range(15) if ex.batch_excluded(i)] == [3, 4, 5, 6, 7, 10, 11, 12]
    assert ex.to_exclusions().batch_ranges == ((3, 7), (10, 12))
    again = ExclusionSet()
    again.load(ex.to_exclusions().to_dict())
    assert again.to_exclusions() == ex.to_exclusions()


@pytest.mark.parametrize("n", [1, 5, 4099, 10**9])
def test_positions_invert_the_order_and_at_maps_any_positions(n):
    perm = Permutation(n, seed=2, epoch=1)
    where = np.random.default_rng(0).choice(n, min(n, 3000), replace=False)
    indices = perm.at(where)
    assert indices.tolist() == [perm[int(p)] for p in where[:50]] + indices[50:].tolist()
    assert perm.positions(indices).tolist() == where.tolist()
