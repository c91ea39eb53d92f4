"""Directives at step boundaries, single process: rollback in place, exclusions, freeze, overrides, stop."""

from __future__ import annotations

import threading
import time

import pytest

from supervisor import sdk
from supervisor.checkpoint import CheckpointStore
from supervisor.storage import open_backend
from tests.sdk.conftest import make_run, records, train


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(open_backend(str(tmp_path / "store")), "job")


def events(recs):
    return [(r["step"], e) for r in recs for e in r.get("events", [])]


def test_rollback_in_place_replays_bit_identical_losses(dataset, store):
    model, _, _, loader, probe, transport = make_run(dataset, checkpoint=store, checkpoint_every=4)
    train(model, loader, probe, 4)
    first = train(model, loader, probe, 5)  # the boundary before this saved step 4
    # Step 8's save is asynchronous: read the store once (two reads could straddle its commit).
    assert store.steps() in ([4], [4, 8])
    transport.deliver(sdk.RollbackInPlace(step=4, id="rb1"))
    again = train(model, loader, probe, 5)
    assert again == first  # bit-identical: model, optimizer, scheduler, RNG and data cursor restored
    recs = records(probe, transport)
    assert ("directive_applied:rb1:rollback" in {e for _, e in events(recs)}) or any(
        "directive_applied:rb1:rollback" in r.get("events", []) for r in transport.records
    )
    after = [r for r in recs if "resumed" in r.get("events", [])]
    assert (
        after and after[0]["step"] == 5 and any(e.startswith("rolled_back:9:4") for e in after[0]["events"])
    )


def test_rollback_with_exclusions_never_replays_excluded(dataset, store):
    model, _, _, loader, probe, transport = make_run(dataset, checkpoint=store, checkpoint_every=3)
    train(model, loader, probe, 6)
    recs = records(probe, transport)
    bad = recs[3]["samples"][:2]  # step 4's batch, after checkpoint 3
    transport.deliver(
        sdk.RollbackInPlace(step=3, exclusions=sdk.Exclusions(samples=tuple(bad), sources=("tests",)))
    )
    train(model, loader, probe, 8)
    later = [r for r in records(probe, transport) if r["time"] > recs[-1]["time"]]
    seen = {s for r in later for s in r["samples"]}
    assert later and not seen.intersection(bad) and not any(s.startswith("tests:") for s in seen)
    assert loader.exclusions().sources == ("tests",)


def test_freeze_parks_until_continue(dataset):
    model, _, _, loader, probe, transport = make_run(dataset, freeze_poll_s=0.01)
    train(model, loader, probe, 2)
    transport.deliver(sdk.Freeze(id="fz"))
    released = threading.Event()

    def supervisor():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any("directive_applied:fz:freeze" in r.get("events", []) for r in list(transport.records)):
                transport.deliver(sdk.Snapshot(id="snap"), sdk.ApplyOverrides(lr_scale=0.5, id="ap"))
                break
            transport.flush(0.05)
        while time.monotonic() < deadline:
            recs = list(transport.records)
            if any("directive_failed:snap:snapshot" in r.get("events", []) for r in recs) and any(
                "directive_applied:ap:apply" in r.get("events", []) for r in recs
            ):
                released.set()
                transport.deliver(sdk.Continue(id="go"))
                return
            transport.flush(0.05)

    th = threading.Thread(target=supervisor)
    th.start()
    train(model, loader, probe, 2)
    th.join(10)
    assert released.is_set()  # training resumed only after the release
    recs = records(probe, transport)
    assert probe.step_count == 4
    controls = [r for r in transport.records if r.get("control")]
    assert controls and all("loss" not in r for r in controls)
    assert recs[-1]["lr"] == pytest.approx(recs[1]["lr"] * 0.5 * (4 / 2), rel=1e-6)  # LambdaLR warmup (s+1)/5


def test_apply_overrides_warmup_clip_and_skip(dataset):
    model, opt, _, loader, probe, transport = make_run(dataset)
    train(model, loader, probe, 5)
    transport.deliver(sdk.ApplyOverrides(warmup_steps=4, grad_clip=1e-4, skip_batches=2, id="ap"))
    train(model, loader, probe, 4)
    recs = records(probe, transport)
    assert "directive_applied:ap:apply" in recs[4]["events"]
    base = 3e-3
    assert [r["lr"] for r in recs[5:9]] == pytest.approx([base * k / 4 for k in (1, 2, 3, 4)])
    assert recs[5]["attrs"]["batch"] == recs[4]["attrs"]["batch"] + 3  # two batches skipped
    assert all(
        g["lr"] == pytest.approx(base) for g in opt.param_groups
    )  # the scheduler never saw the override
    assert {"lr_override", "grad_clip_override", "data_override"} <= set(recs[4]["events"])
    assert probe.steering.grad_clip == 1e-4


def test_stop_ends_the_loop(dataset):
    model, _, _, loader, probe, transport = make_run(dataset)
    train(model, loader, probe, 2)
    transport.deliver(sdk.Stop(id="st"))
    assert train(model, loader, probe, 10) == []
    assert probe.should_stop
    assert "directive_applied:st:stop" in records(probe, transport)[-1]["events"]


def test_max_steps_stops_the_loader(dataset):
    model, _, _, loader, probe, transport = make_run(dataset, max_steps=3)
    assert len(train(model, loader, probe, 10)) == 3


def test_a_frozen_rank_repeats_that_it_is_there(dataset, monkeypatch):
    """A frozen rank beats from its training thread while parked, so a rank stopped or hung after the
    freeze goes silent and the supervisor treats it as hung (issue 29)."""
    from supervisor.sdk import steering

    monkeypatch.setattr(steering, "HOLD_BEAT_S", 0.02)
    model, _, _, loader, probe, transport = make_run(dataset, freeze_poll_s=0.01)
    train(model, loader, probe, 2)
    transport.deliver(sdk.Freeze(id="fz"))

    def beats() -> list[dict]:
        return [
            r for r in list(transport.records) if any(e.startswith("frozen:") for e in r.get("events", []))
        ]

    def supervisor():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(beats()) < 3:
            transport.flush(0.05)
        transport.deliver(sdk.Continue(id="go"))

    th = threading.Thread(target=supervisor)
    th.start()
    train(model, loader, probe, 1)
    th.join(10)
    got = beats()
    assert len(got) >= 3 and all(r["control"] and r["events"] == ["frozen:2"] for r in got)


@pytest.mark.parametrize("together", [True, False])
def test_a_finish_received_while_frozen_at_the_last_step_ends_the_hold(dataset, monkeypatch, together):
    """Sampler cell 117597:263588: an incident at the last steps froze the ranks where they held at
    the end; its plan ended (the window skipped: training over), and the release and the ``Finish``
    reached the ranks while they were still parked in the freeze. The freeze applied the ``Finish``
    as a no-op and the ranks went back to holding, waiting for a ``Finish`` already acknowledged:
    the job never ended."""
    from supervisor.sdk import steering
    from supervisor.sdk.directives import Finish

    monkeypatch.setattr(steering, "HOLD_BEAT_S", 0.02)
    model, _, _, loader, probe, transport = make_run(dataset, max_steps=3, freeze_poll_s=0.01)
    transport.hold_at_end_s = 60.0  # as under a supervisor: the ranks hold at the last step

    def sent(event: str) -> bool:
        return any(event in r.get("events", []) for r in list(transport.records))

    def supervisor() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not sent("end_reached:3"):
            transport.flush(0.05)
        transport.deliver(sdk.Freeze(id="fz"))
        while time.monotonic() < deadline and not sent("directive_applied:fz:freeze"):
            transport.flush(0.05)
        if together:
            transport.deliver(sdk.Continue(id="go"), Finish(id="fin"))
        else:
            transport.deliver(Finish(id="fin"))

    th = threading.Thread(target=supervisor, daemon=True)
    th.start()
    done: list[int] = []
    trainer = threading.Thread(target=lambda: done.append(len(train(model, loader, probe, 10))), daemon=True)
    trainer.start()
    trainer.join(15)
    if trainer.is_alive():  # the hang this test is for: let the rank go before failing
        transport.deliver(sdk.Stop(id="unblock"))
        trainer.join(10)
    transport.flush(5.0)
    assert done == [3] and sent("directive_applied:fin:finish")
    assert not any("directive_applied:unblock:stop" in r.get("events", []) for r in list(transport.records))
