"""The GPU path in one command and one table: probe overhead, checkpoint I/O, a supervised GPU job.

    .venv/bin/python bench/gpu_check.py                 # one CUDA device: under 8 minutes
    .venv/bin/python bench/gpu_check.py --device cpu    # the same path at tiny sizes, in seconds
    .venv/bin/python bench/gpu_check.py --only probe,ckpt,job

Rows (each measured side by side in this run; ratios, not absolutes, are the figures):

- ``probe``: step time of the example LM (>= 100M parameters on CUDA, fp32, fused AdamW) with
  the minimal and the default probe, against the plain loop (clip, step, schedule, zero grad),
  paired in rounds (each variant one block of steps per round, the order shuffled; a block ends
  with a device sync); the median over rounds of the block's time / the plain loop's in the
  same round. Goal: default <= 1 % on a GPU (bench/probe_overhead.py has every variant).
- ``ckpt``: a model + AdamW state of 1B parameters (12 GB on the device): synchronous DCP save
  against raw write+fsync of the same bytes; the asynchronous save's blocked time (the call plus
  what the next optimizer step waited for the staging copy) against the synchronous save
  (goal <= 0.15); verify against raw read speed; DCP restore into the live CUDA tensors against
  a raw read (goal <= 1.5). The same calls as bench/checkpoint_io.py, once.
- ``job``: the demo job (examples/tinylm, 1 worker, NCCL, world size 1, the model on the device)
  with the demo's LR fault, supervised on a local Ray: the fault is rolled back in place (the
  rollback's mode is ``in_place``: CUDA tensors restored in the live process), and the final
  loss (mean of the last 10 steps) is within 5 % of a clean run of the same job; every periodic
  save of both runs committed, and the rollback went to the newest checkpoint before the fault (on CPU the two
  runs go side by side; on CUDA one after the other, each worker needing the one device).

Exit code 1 when a row misses its goal, 2 on bad arguments (``--device cuda`` without a device).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.append(str(BENCH))  # probe_overhead, checkpoint_io

#: Sizes per device: the GPU check, and the CPU smoke run (the same code path in seconds).
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {"probe": {"d_model": 1024, "layers": 8, "heads": 16, "seq": 512, "batch": 8, "blocks": 12,
                       "block_steps": 10, "data_bytes": 300_000},
             "ckpt": {"params": 1e9, "width": 4096, "batch": 16},
             # steps of ~10-20 ms: a run the supervisor follows step by step, as it would a real one
             "job": {"d_model": 512, "layers": 8, "seq": 512, "batch": 16, "max_steps": 400, "fault_step": 250,
                     "every": 50}},
    "cpu": {"probe": {"d_model": 32, "layers": 1, "heads": 2, "seq": 32, "batch": 4, "blocks": 3,
                      "block_steps": 3, "data_bytes": 40_000},
            "ckpt": {"params": 2e6, "width": 512, "batch": 2},
            # the demo's model: a tinier one trains faster than a loaded 2-core box supervises it
            "job": {"d_model": 64, "layers": 2, "seq": 64, "batch": 8, "max_steps": 300, "fault_step": 200,
                    "every": 50}},
}  # fmt: skip
PROBE_VARIANTS: dict[str, dict[str, Any] | None] = {
    "plain loop": None,
    "minimal probe": {"norms": False, "fingerprint_every": 0},
    "default probe": {},
}
Row = tuple[str, str, str, str]  # (what, measured, goal, verdict)


def _verdict(ok: bool | None, judged: bool = True) -> str:
    """``-`` where no goal applies, or at the CPU smoke run's sizes (the goals are for the GPU sizes)."""
    return "-" if ok is None or not judged else ("ok" if ok else "MISSED")


# -- probe overhead ---------------------------------------------------------------------------
def probe_rows(device: str) -> list[Row]:
    from probe_overhead import Loop, measure, paired  # type: ignore[import-not-found]

    from examples.tinylm.data import build_dataset
    from examples.tinylm.model import TinyLM, TinyLMConfig

    size = SIZES[device]["probe"]
    args = argparse.Namespace(device=device, batch=size["batch"], fused=False)
    torch.manual_seed(0)
    cfg = TinyLMConfig(
        seq_len=size["seq"], d_model=size["d_model"], n_layers=size["layers"], n_heads=size["heads"]
    )
    base = TinyLM(cfg).to(device)
    dataset = build_dataset(seq_len=size["seq"], max_bytes_per_source=size["data_bytes"])
    loops = [Loop(name, base, dataset, args, s) for name, s in PROBE_VARIANTS.items()]
    measure(loops, size["blocks"], size["block_steps"], time.perf_counter, warmup=1)
    params = sum(p.numel() for p in base.parameters()) / 1e6
    ref = statistics.median(loops[0].times)
    rows: list[Row] = [(f"probe: plain step ({params:,.2f}M params)", f"{ref * 1e3:.2f} ms", "", "-")]
    goal = 1.0 if device == "cuda" else None  # the CPU goal is at 3M params: bench/probe_overhead.py
    for loop in loops[1:]:
        over = 100 * paired(loop.times, loops[0].times)[0]
        is_default = loop.name == "default probe"
        rows.append((f"probe: {loop.name}", f"{over:+.2f} % of a step", "<= 1 %" if is_default else "",
                     _verdict(over <= goal if is_default and goal is not None else None)))  # fmt: skip
        if loop.probe is not None:
            loop.probe.close()
    return rows


# -- checkpoint I/O ---------------------------------------------------------------------------
def ckpt_rows(device: str, work: Path) -> list[Row]:
    import checkpoint_io as cio  # type: ignore[import-not-found]

    from supervisor.checkpoint import CheckpointStore, verify
    from supervisor.checkpoint.saver import Checkpointer
    from supervisor.checkpoint.training_state import load_training_state, save_training_state
    from supervisor.storage import LocalBackend

    size = SIZES[device]["ckpt"]
    model, opt = cio.build(0.0, size["params"], device, size["width"])
    tensors = list(model.parameters()) + [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    store = CheckpointStore(LocalBackend(work / "storage"), "gpu-check")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    state: dict[str, Any] = {"rank": 0, "world_size": 1, "model": model, "optimizer": opt}
    t: dict[str, float] = {}
    t["save"] = cio.timed(lambda: (sync(), save_training_state(store, 1, **state)))
    raw = work / "raw.bin"
    t["write"] = _raw_write(cio, raw, model, opt)
    cio.raw_read(raw)  # warm, like the checkpoint right after its save
    t["read"] = cio.timed(lambda: cio.raw_read(raw))
    raw.unlink()
    saver = Checkpointer(store, rank=0, world_size=1)
    cio.train_step(model, opt, size["batch"], sync)  # warm
    start = time.perf_counter()
    handle = saver.save(2, model=model, optimizer=opt, blocking=False)
    call = time.perf_counter() - start
    cio.train_step(model, opt, size["batch"], sync)  # its optimizer step waits for the staging copy
    t["blocked"] = call + handle.staged_wait_s
    handle.result()
    saver.close()
    verify(store, 1, record=False)  # warm
    t["verify"] = cio.timed(lambda: verify(store, 1, record=False))
    t["restore"] = cio.timed(lambda: (load_training_state(store, 1, **state), sync()))
    gb = nbytes / 1e9
    params = sum(p.numel() for p in model.parameters())
    judged = device == "cuda"  # at the smoke run's 30 MB, fixed costs dominate every ratio
    return [
        (f"ckpt: state ({params / 1e6:,.0f}M params + AdamW, {device})", f"{gb:.2f} GB",
         "", "-"),
        ("ckpt: raw write+fsync / raw read", f"{t['write']:.2f} s / {t['read']:.2f} s",
         "", "-"),
        ("ckpt: DCP save (sync)", f"{t['save']:.2f} s = {t['save'] / t['write']:.2f}x raw write",
         "<= 1.2x", _verdict(t["save"] / t["write"] <= 1.2, judged)),
        ("ckpt: async save, blocked", f"{t['blocked']:.3f} s = {t['blocked'] / t['save']:.3f}x sync save",
         "<= 0.15x", _verdict(t["blocked"] / t["save"] <= 0.15, judged)),
        ("ckpt: verify", f"{t['verify']:.2f} s = {t['read'] / t['verify']:.2f}x raw read speed",
         ">= 0.8x", _verdict(t["read"] / t["verify"] >= 0.8, judged)),
        ("ckpt: DCP restore", f"{t['restore']:.2f} s = {t['restore'] / t['read']:.2f}x raw read",
         "<= 1.5x", _verdict(t["restore"] / t["read"] <= 1.5, judged)),
    ]  # fmt: skip


def _raw_write(cio: Any, raw: Path, model: Any, opt: Any) -> float:
    """Raw write+fsync of the state's bytes from host memory (the host copy is made untimed)."""
    views = cio.state_bytes(model, opt)
    return float(cio.timed(lambda: cio.raw_write(raw, views)))


# -- a supervised job on the device -----------------------------------------------------------
def job_rows(device: str, work: Path) -> list[Row]:
    import ray

    from supervisor.client import api
    from supervisor.incidents import EventKind
    from supervisor.ranks.names import NAMESPACE

    size = SIZES[device]["job"]
    fault = [{"kind": "lr_spike", "step": size["fault_step"], "factor": 40}]
    ray.init(address="local", num_cpus=4, num_gpus=1 if device == "cuda" else 0, namespace=NAMESPACE,
             include_dashboard=False, log_to_driver=False)  # fmt: skip
    try:
        if device == "cuda":  # each job's worker needs the one GPU: one after the other
            clean = _finish_job(api, _start_job(api, work, "clean", device, size, []), 900)
            faulty = _finish_job(api, _start_job(api, work, "lr-fault", device, size, fault), 900)
        else:  # on CPU the two jobs (own storage, trace and worker) run side by side
            started = [
                _start_job(api, work, n, device, size, f) for n, f in (("clean", []), ("lr-fault", fault))
            ]
            clean, faulty = (_finish_job(api, s, 900) for s in started)
    finally:
        ray.shutdown()
    rolled = [e for e in faulty["timeline"] if e.kind is EventKind.ROLLED_BACK]
    modes = sorted({str(e.result.get("mode")) for e in rolled})
    # The newest periodic checkpoint before the fault's step: every save before it committed.
    newest = (size["fault_step"] - 1) // size["every"] * size["every"]
    in_place = (
        bool(rolled) and modes == ["in_place"] and all(e.result.get("to_step") == newest for e in rolled)
    )
    failed = clean["saves_failed"] + faulty["saves_failed"]
    gap = abs(faulty["loss"] / clean["loss"] - 1)
    finished = clean["phase"] == faulty["phase"] == "finished"
    back = ", ".join(f"{e.result['from_step']}->{e.result['to_step']}" for e in rolled) or "none"
    backend = "NCCL" if device == "cuda" else "gloo"
    return [
        (f"job: clean run ({backend}, world size 1)", f"{clean['phase']}, loss {clean['loss']:.4f}", "finished",
         _verdict(clean["phase"] == "finished")),
        ("job: periodic saves", f"{failed} failed", "none failed", _verdict(not failed)),
        ("job: LR fault, rollback", f"{back} ({'/'.join(modes) or '-'})", f"in place, to {newest}",
         _verdict(in_place)),
        ("job: LR fault, final loss vs clean", f"{faulty['loss']:.4f} ({100 * gap:.1f} % off)", "within 5 %",
         _verdict(finished and gap <= 0.05)),
    ]  # fmt: skip


def _start_job(
    api: Any, work: Path, name: str, device: str, size: dict[str, Any], faults: list[Any]
) -> tuple[Any, Any, Path]:
    """Launch the demo job on the local Ray: (its spec, the supervisor's handle, its trace)."""
    from supervisor.config.job import JobSpec
    from supervisor.config.runtime import RuntimeSettings

    job = JobSpec.model_validate({
        "name": f"gpu-check-{name}", "entrypoint": "examples.tinylm.train:main", "max_steps": size["max_steps"],
        "config": {"model": {"d_model": size["d_model"], "n_layers": size["layers"], "n_heads": 4,
                             "seq_len": size["seq"]},
                   "batch_size": size["batch"], "data": {"max_bytes_per_source": 200_000}, "device": device},
        "resources": {"num_workers": 1, "gpus_per_worker": 1 if device == "cuda" else 0},
        "storage": {"path": str(work / name)}, "policy": "default",
        "checkpoint": {"every_steps": size["every"], "keep": 3},
        "telemetry": {"min_history": 50, "window": 200, "hang_timeout_s": 120},
        "faults": faults,
    })  # fmt: skip
    trace = work / f"{name}.jsonl"
    settings = RuntimeSettings.model_validate(
        {"healthy_after_steps": 5, "step_deadline_s": 10.0, "trace_path": str(trace)}
    )
    return job, api.launch(job, settings), trace


def _finish_job(api: Any, started: tuple[Any, Any, Path], timeout_s: float) -> dict[str, Any]:
    """Wait for the job to end: its phase, final loss (mean of the last 10 steps) and incident timeline."""
    from supervisor.incidents.paths import open_incident_store
    from supervisor.sdk.context import trace_path

    job, handle, trace = started
    final = api.wait(handle, timeout_s)
    recs = [json.loads(x) for x in trace_path(str(trace), 0, 1).read_text().splitlines() if x.strip()]
    last: dict[int, float] = {}
    for r in recs:  # a re-trained step's later record replaces the abandoned one
        if "loss" in r and not r.get("control"):
            last[int(r["step"])] = float(r["loss"])
    tail = [last[s] for s in sorted(last)[-10:]]
    store = open_incident_store(job)
    timeline = [e for inc in store.list_incidents(job=job.name) for e in store.timeline(inc.id)]
    failed = [e for r in recs for e in r.get("events") or () if str(e).startswith("checkpoint_failed")]
    return {
        "phase": final["phase"],
        "loss": statistics.fmean(tail) if tail else float("nan"),
        "timeline": timeline,
        "saves_failed": len(failed),
    }


# -- the table ---------------------------------------------------------------------------------
def table(rows: list[Row]) -> str:
    head: Row = ("check", "measured", "goal", "")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *map(line, rows)])  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--only", default="probe,ckpt,job", help="comma-separated: probe, ckpt, job")
    ap.add_argument("--dir", default=None, help="where checkpoints are written (default: a temp dir)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(parts) - {"probe", "ckpt", "job"})
    if unknown:
        print(
            f"gpu_check.py: --only: unknown part {unknown[0]!r} (choices: probe, ckpt, job)", file=sys.stderr
        )
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check.py: --device cuda: torch {torch.__version__} sees no CUDA device here "
              "(--device cpu runs the same path at tiny sizes)", file=sys.stderr)  # fmt: skip
        return 2
    from supervisor import logging as slog

    slog.configure("error")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.dir))
    rows: list[Row] = []
    try:
        if "probe" in parts:
            rows += probe_rows(args.device)
        if "ckpt" in parts:
            rows += ckpt_rows(args.device, work)
        if "job" in parts:
            rows += job_rows(args.device, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"gpu_check on {name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    print(table(rows))
    return 1 if any(r[3] == "MISSED" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
