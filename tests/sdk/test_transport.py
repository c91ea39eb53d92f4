"""Records leave asynchronously, in batches; a slow or dead receiver never blocks training."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

from supervisor.sdk import Directive, Freeze, OfflineTransport, RollbackInPlace
from supervisor.sdk.directives import Exclusions
from supervisor.sdk.transport import BatchingTransport


def test_batches_and_flush():
    got: list[list[dict]] = []
    t = BatchingTransport(got.append, batch_size=10, flush_interval_s=5.0)
    t.send([{"step": i, "loss": 1.0} for i in range(25)])
    assert t.flush(5.0)
    assert sum(len(b) for b in got) == 25 and max(len(b) for b in got) == 10
    t.close()
    assert t.stats.sent == 25 and t.stats.dropped == 0


def test_dead_sink_never_blocks_and_drops_are_counted():
    release = threading.Event()
    t = BatchingTransport(lambda batch: release.wait(), batch_size=5, max_buffer=50, flush_interval_s=0.01)
    start = time.monotonic()
    for i in range(1000):
        t.send([{"step": i, "loss": 1.0}])
    assert time.monotonic() - start < 1.0  # 1000 sends with a hung receiver
    assert t.stats.dropped >= 1000 - 50 - 5
    release.set()
    t.close(2.0)


def test_failing_sink_requeues_then_delivers():
    got, fails = [], [3]

    def sink(batch):
        if fails[0] > 0:
            fails[0] -= 1
            raise ConnectionError("supervisor restarting")
        got.extend(batch)

    t = BatchingTransport(sink, batch_size=4, flush_interval_s=0.01)
    t.send([{"step": i, "loss": 0.5} for i in range(10)])
    assert t.flush(10.0)
    assert [r["step"] for r in got] == list(range(10)) and t.stats.sink_errors == 3
    t.close()


def test_offline_writes_jsonl_with_nonfinite(tmp_path):
    path = tmp_path / "trace.jsonl"
    t = OfflineTransport(path)
    t.send([{"step": 1, "loss": math.nan}, {"step": 2, "loss": math.inf}])
    t.close()
    lines = path.read_text().splitlines()
    assert "NaN" in lines[0] and "Infinity" in lines[1]
    assert math.isnan(json.loads(lines[0])["loss"])


def test_directives_round_trip_and_unknown_kind():
    d = RollbackInPlace(step=40, exclusions=Exclusions(samples=("code:a.py:0",), batch_ranges=((3, 5),)))
    assert Directive.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    assert Freeze().id != Freeze().id
    with pytest.raises(Exception, match="valid: apply, continue, finish, freeze, replay, rollback"):
        Directive.from_dict({"kind": "reboot"})
