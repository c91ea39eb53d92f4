"""The mixture-shift drill's dataset at scale: a source's samples are picked per index, with
memory of one count per source (no list of each source's samples)."""

from __future__ import annotations

import tracemalloc

from supervisor.drills.faults import FaultPlan
from supervisor.drills.glue import MixtureDataset, plan_dataset

N = 100_000


class Striped:
    """``N`` samples; every 50th is of source ``rare``, computed from the index (no table)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i

    def source(self, i: int) -> str:
        return "rare" if i % 50 == 0 else "common"

    def sample_id(self, i: int) -> str:
        return f"s{i}"


def mixed(weights: dict[str, float]) -> MixtureDataset:
    plan = FaultPlan.from_specs(
        [{"kind": "mixture_shift", "step": 0, "weights": weights}], rank=0, world_size=1
    )
    ds = plan_dataset(plan, Striped())
    assert isinstance(ds, MixtureDataset)
    return ds


def test_picks_stay_in_the_source_spread_over_it_and_take_no_per_sample_memory():
    ds = mixed({"rare": 1.0})
    tracemalloc.start()
    try:
        first = ds.locate(7, 0)  # counts the sources: one pass over the dataset
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, (
        f"{peak} bytes: something of dataset size was built"
    )  # lists of 10^5 ints: ~3.6 MB
    picks = [ds.locate(i, 0) for i in range(1000)]
    assert picks[7] == first and picks == [ds.locate(i, 0) for i in range(1000)]  # fixed by the index
    assert all(j % 50 == 0 for j in picks)
    assert len(set(picks)) > 600  # 1,000 draws over 2,000 rare samples: ~780 distinct if uniform
    assert {ds.sample_id(i) for i in range(20)} <= {f"s{j}" for j in range(0, N, 50)}


def test_weights_are_followed_for_a_rare_source():
    ds = mixed({"rare": 0.5, "common": 0.5})
    share = sum(ds.source(i) == "rare" for i in range(2000)) / 2000
    assert 0.42 < share < 0.58
