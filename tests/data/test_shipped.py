"""What a loader worker ships beside a batch (one bytes object, named on demand) names exactly what
the training process would: any string an ID or source can be, the batch index and the cursor."""

from __future__ import annotations

import pytest
import torch

from supervisor.sdk import Exclusions, SupervisedLoader
from supervisor.sdk.data.mapstyle import _cursor, named, ship
from supervisor.sdk.data.schedule import Cursor, Draw

ODD = ["", "plain", "naïve-文書", "tab\there", "lone \ud800 surrogate", "space and\nnewline"]


def draw(ids, sources):
    return Draw(ids, sources, 41, list(range(len(ids))), Cursor(3, 2**40, 77, 2))


@pytest.mark.parametrize(
    ("ids", "sources", "own_sources", "packed"),
    [
        ([str(i) for i in (5, 10**12, 0)], ["default"] * 3, False, True),
        (ODD, ["books", "", "wiki\ud800", "x", "y", "z"], True, True),
        (ODD, ["default"] * 6, False, True),
        (["a", "b\x00c"], ["s", "t"], True, False),  # a NUL inside an ID: the strings themselves
        (["a", "b"], ["s\x00", "t"], True, False),  # ... or inside a source
        ([""], [""], True, True),  # one empty ID and source: not "default"
    ],
)
def test_shipped_metadata_names_exactly(ids, sources, own_sources, packed):
    shipped = ship(draw(ids, sources), own_sources)
    assert isinstance(shipped, bytes) == packed
    meta = named(shipped)
    assert (meta.sample_ids, meta.sources, meta.batch_index) == (ids, sources, 41)
    assert _cursor(shipped) == Cursor(3, 2**40, 77, 2)


class Plain(torch.utils.data.Dataset[torch.Tensor]):
    """Tensors (no IDs in the batch), named by index."""

    def __len__(self) -> int:
        return 97

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


class Odd(Plain):
    """Its own IDs, which do not invert: a NUL in some, an unpaired surrogate, an empty prefix."""

    def sample_id(self, i: int) -> str:
        return ODD[i % len(ODD)] + ("\x00" if i % 7 == 0 else "") + str(i)


@pytest.mark.parametrize("dataset", [Plain, Odd])
def test_workers_name_tensor_batches_as_the_training_process_does(dataset):
    ref = SupervisedLoader(dataset(), 4, seed=3, rank=1, world_size=2)
    two = SupervisedLoader(dataset(), 4, seed=3, rank=1, world_size=2, num_workers=2)
    try:
        for ld in (ref, two):
            ld.exclude(Exclusions(samples=(ref.sample_id(5), ref.sample_id(60)), batch_ranges=((3, 4),)))
        for _ in range(30):  # past the end of epoch 0 (12 global batches of 8)
            a, b = ref.next_batch(), two.next_batch()
            assert torch.equal(a, b)
            ma, mb = ref.batch_meta(a), two.batch_meta(b)
            assert (mb.sample_ids, mb.sources, mb.batch_index) == (ma.sample_ids, ma.sources, ma.batch_index)
            assert mb.sample_ids == [ref.sample_id(int(i)) for i in b]
            assert two.state_dict() == ref.state_dict()
        assert two.state_dict()["cursor"]["epoch"] >= 2
    finally:
        two.close()
