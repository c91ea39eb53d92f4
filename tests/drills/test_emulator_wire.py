"""The rank emulator packs a step's records of all its ranks in columns, without a dict per record:
the batch must be the one ``wire.pack`` makes of the records themselves -- the same bytes -- or the
scale bench would drive the supervisor with something no rank sends. Pure: no Ray is started."""

from __future__ import annotations

import pickle
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from supervisor.drills.emulator import EmulatorConfig, EmulatorHost, _Link
from supervisor.sdk.wire import pack, unpack
from tests.runtime.conftest import make_job


def _host(tmp_path: Path, ranks: int, **cfg: Any) -> EmulatorHost:
    job = make_job(tmp_path, "emu", resources={"num_workers": ranks})
    host = EmulatorHost(
        job.model_dump(mode="json"), asdict(EmulatorConfig(ranks=ranks, checkpoint_every=0, **cfg)), 0
    )
    host.links = [_Link(r, "t") for r in range(ranks)]
    host.lr_scale, host.pending_events, host.step = 1.0, [], 0
    return host


def _calls(host: EmulatorHost) -> list[Any]:
    calls = []
    for x in host.links:
        batch = list(x.backlog)
        x.backlog.clear()
        held = (batch[0][0], batch[-1][0]) if batch else None
        calls.append((x.rank, x.id, held, [s for s, _ in batch], [r for _, r in batch]))
    return calls


def _as_records(host: EmulatorHost, calls: list[Any]) -> list[Any]:
    return [(rank, link, held, seqs, [x if type(x) is dict else host.record(x, rank) for x in recs])
            for rank, link, held, seqs, recs in calls]  # fmt: skip


@pytest.mark.parametrize(
    ("steps", "fault_at", "fault_rank"),
    [((7,), None, None), ((48, 49, 50, 51), 50, None), ((120, 121), 121, 3)],
)
def test_columns_are_the_bytes_pack_makes_of_the_records(
    tmp_path: Path, steps: tuple[int, ...], fault_at: int | None, fault_rank: int | None
) -> None:
    host = _host(tmp_path, 6, fault_rank=fault_rank, step_time_s=0.25)
    for step in steps:
        host.step = step
        host.pending_events = ["checkpoint_saved"] if step % 2 else []
        host.lr_scale = 0.5 if step > 100 else 1.0
        host._produce(step == fault_at)
    calls = _calls(host)
    fast = host.pack(calls)
    assert fast["rows"] == [] and fast["m"] == 6 * len(steps)  # every record in the columns
    assert pickle.dumps(fast) == pickle.dumps(pack(_as_records(host, calls)))
    got = unpack(fast, as_dicts=True)
    assert [g[0] for g in got] == list(range(6)) and all(len(g[4]) == len(steps) for g in got)
    if fault_at is not None:
        bad = {g[0] for g in got for r in g[4] if r["step"] == fault_at and r["nonfinite"]}
        assert bad == ({fault_rank} if fault_rank is not None else set(range(6)))


def test_a_batch_with_a_control_message_or_a_resent_link_goes_as_records(tmp_path: Path) -> None:
    host = _host(tmp_path, 4)
    host.step = 3
    host._produce(False)
    host._control(["frozen:3"])
    calls = _calls(host)
    mixed = host.pack(calls)
    assert len(mixed["rows"]) == 4  # the control messages travel as themselves, at their places
    assert pickle.dumps(mixed) == pickle.dumps(pack(_as_records(host, calls)))
    host.step = 4
    host._produce(False)
    calls = _calls(host)
    calls[2] = (*calls[2][:3], [], [])  # a link with nothing new (an ack poll): not the same steps
    assert pickle.dumps(host.pack(calls)) == pickle.dumps(pack(_as_records(host, calls)))
