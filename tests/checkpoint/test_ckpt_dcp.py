"""Model and optimizer state through DCP: FSDP2 on real gloo ranks, resharding, asynchronous saves,
a rank killed in the middle of one; and single-process saves on local disk and S3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from supervisor.checkpoint import CheckpointStore, select_restart_target, verify
from supervisor.checkpoint.saver import Checkpointer
from supervisor.checkpoint.training_state import load_training_state
from supervisor.core.model import HealthMark
from supervisor.storage import LocalBackend
from tests.checkpoint import dcp_worker

WORKER = Path(__file__).with_name("dcp_worker.py")


def spawn(mode: str, world: int, workdir: Path, *extra: str) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), mode, str(r), str(world), str(workdir), *extra],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(world)
    ]


def run(mode: str, world: int, workdir: Path, *extra: str) -> list[dict]:
    procs = spawn(mode, world, workdir, *extra)
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    return [json.loads((workdir / f"{mode}.rank{r}.json").read_text()) for r in range(world)]


def equal(a: dict[str, list[float]], b: dict[str, list[float]]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] for k in a)


@pytest.mark.slow  # 2 + 4 gloo processes with FSDP2: ~40 s on a busy 2-core box
def test_fsdp2_saved_on_two_ranks_restores_on_one_and_four(tmp_path: Path) -> None:
    saved = run("save", 2, tmp_path)
    assert all(r["async_committed"] for r in saved)
    store = CheckpointStore(LocalBackend(tmp_path / "storage"), "fsdp")
    assert store.steps() == [2, 4]
    for step in (2, 4):
        manifest = store.manifest(step)
        assert manifest.layout == "dcp" and manifest.world_size == 2
        assert {f.rank for f in manifest.files} == {None, 0, 1}  # .metadata + each rank's shard and state
        assert verify(store, step, deep=True).ok
    # The asynchronous save holds step 4's values although training went on to step 6 meanwhile.
    four = run("restore", 4, tmp_path, "4")
    assert all(equal(r["params"], saved[0]["params4"]) for r in four)
    assert [r["cursor"] for r in four] == [40, 41, 40, 41]  # per-rank state of rank (r % 2)
    assert all(r["moments"] > 0 for r in four)  # the optimizer state came back too
    # One process, a plain module: the same values from the 2-rank sharded files.
    model, opt = dcp_worker.build(1)
    loaded = load_training_state(store, 2, rank=0, world_size=1, model=model, optimizer=opt)
    assert equal(dcp_worker.full_params(model), saved[0]["params2"])
    assert any("world_size changed" in line for line in loaded.report)


@pytest.mark.slow  # two generations of 2 gloo processes: ~30 s on a busy 2-core box
def test_rank_killed_during_async_save_leaves_no_target_and_next_save_commits(tmp_path: Path) -> None:
    store = CheckpointStore(LocalBackend(tmp_path / "storage"), "fsdp")
    procs = spawn("die", 2, tmp_path)
    try:
        assert procs[1].wait(timeout=240) == -signal.SIGKILL
        deadline = time.monotonic() + 60
        while not (tmp_path / "staged.rank0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "staged.rank0").exists()  # rank 0 got past staging: training was free to go on
        assert procs[0].poll() is None  # ...and its commit is still waiting for rank 1
        assert store.steps() == [1] and store.find(2) is None
        assert any(n.startswith("dcp-") for n in store.step_dirs()[2])  # shard files exist, uncommitted
        assert select_restart_target(store).step == 1  # type: ignore[union-attr]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()  # the runtime ends a group whose rank died the same way
            proc.communicate(timeout=60)
    assert not list(tmp_path.glob("unexpected.rank*"))
    assert run("resume", 2, tmp_path)[0]["committed"]
    result = verify(store, 2, deep=True)
    assert result.ok and result.manifest is not None and result.manifest.health == HealthMark.VERIFIED
    manifest = result.manifest
    orphans = set(store.step_dirs()[2]) - {f.name for f in manifest.files} - {"MANIFEST.json"}
    # the killed save's files (its DCP shards, rank 0's per-rank state file): garbage, unnamed
    assert orphans and all(n.startswith(("dcp-", "state.rank")) for n in orphans)


def test_async_save_single_process_local_and_s3(store: CheckpointStore) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saver = Checkpointer(store, rank=0, world_size=1)
    handle = saver.save(3, model=model, optimizer=opt, data_state={"cursor": 7}, blocking=False)
    model(torch.randn(8, 16)).pow(2).mean().backward()  # training goes on: the staged copy is written
    opt.step()
    assert store.latest() in (None, 3)  # never ahead of a commit
    manifest = saver.close().result()  # type: ignore[union-attr]
    assert manifest is not None and manifest.layout == "dcp" and handle.blocked_s >= 0
    assert verify(store, 3, deep=True).ok and store.latest() == 3
    loaded = load_training_state(store, 3, rank=0, world_size=1, model=model, optimizer=opt)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert loaded.data_state == {"cursor": 7}


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_async_staging_overlaps_forward_and_the_optimizer_step_waits_for_it(
    tmp_path: Path, device: str
) -> None:
    """Parameters and optimizer state are copied in the background (only the optimizer step changes
    them); buffers, which forward changes (BatchNorm statistics), are copied before save returns.
    Every save of a run commits: on CUDA a stager reused across saves failed all but the first."""
    store = CheckpointStore(LocalBackend(tmp_path / "storage"), "job")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.BatchNorm1d(512), torch.nn.Linear(512, 8))
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train_step() -> None:
        model(torch.randn(32, 512, device=device)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    train_step()
    saver = Checkpointer(store, rank=0, world_size=1)
    for step in (1, 2, 3):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        moments = [s["exp_avg"].clone() for s in opt.state.values()]
        handle = saver.save(step, model=model, optimizer=opt, blocking=False)
        assert handle.staging is not None
        assert sorted(handle.staging.now) == ["1.num_batches_tracked", "1.running_mean", "1.running_var"]
        model(torch.randn(32, 512, device=device)).pow(2).mean().backward()  # forward moves the statistics
        opt.step()  # ... and the optimizer step first waits for the background copy
        assert handle.staging.done() and handle.staged_wait_s >= 0
        opt.zero_grad()
        assert saver.wait() is handle and handle.result() is not None
        fresh = torch.nn.Sequential(
            torch.nn.Linear(512, 512), torch.nn.BatchNorm1d(512), torch.nn.Linear(512, 8)
        ).to(device)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        train_step_state(fresh, fresh_opt, device)
        load_training_state(store, step, rank=0, world_size=1, model=fresh, optimizer=fresh_opt)
        assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())
        assert all(
            torch.equal(m, s["exp_avg"]) for m, s in zip(moments, fresh_opt.state.values(), strict=True)
        )
    saver.close()


def train_step_state(model: torch.nn.Module, opt: torch.optim.Optimizer, device: str = "cpu") -> None:
    """One step, so the optimizer has state tensors to load into."""
    model(torch.randn(4, 512, device=device)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def test_one_save_in_flight_a_snapshot_waits_for_it(tmp_path: Path) -> None:
    store = CheckpointStore(LocalBackend(tmp_path / "storage"), "job")
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saver = Checkpointer(store, rank=0, world_size=1)
    first = saver.save(1, model=model, optimizer=opt, blocking=False)
    assert saver.in_flight is first
    # The snapshot (a blocking save) first waits for the save in flight: both commit, in order.
    snap = saver.save(2, model=model, optimizer=opt, mark=HealthMark.DIAGNOSTIC, blocking=True)
    assert first.done() and saver.in_flight is None
    assert first.result() is not None and snap.result() is not None
    assert store.steps() == [1, 2] and store.manifest(2).health == HealthMark.DIAGNOSTIC
    assert store.latest() == 1  # a diagnostic snapshot never becomes `latest`
    saver.close()


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_host_stager_copies_each_state_it_is_given(device: str) -> None:
    """The replay's stash (``dcp_state.HostStager``) copies a live state again and again, each copy
    that moment's values: on CUDA a DCP stager reused for a second copy failed."""
    from supervisor.checkpoint.dcp_state import HostStager, live_state

    model = torch.nn.Linear(64, 8).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stager = HostStager()
    try:
        for _ in range(3):
            model(torch.randn(4, 64, device=device)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            staged = stager.stage(live_state(model, opt))
            assert staged["model"]["weight"].device.type == "cpu"
            assert torch.equal(staged["model"]["weight"], model.weight.detach().cpu())
    finally:
        stager.close()
