"""Many real ranks on one machine: the drills' faults at 16 torch ranks under the default policy.

    python -m bench.real_ranks                          # 16 ranks, five scenarios, one after another
    python -m bench.real_ranks --ranks 16 --scenario garbage_rank --scenario clean
    python -m bench.real_ranks --smoke                  # the garbage batch alone (tests/bench)

Each scenario is a drill of ``examples/drills/`` (its fault and its expectations at 2 ranks)
with the job made wide and tiny: ``--ranks`` real DDP ranks over gloo, each a Ray actor with
``cpus_per_worker: 0.25`` (one torch thread), a one-layer 16-wide TinyLM, 180 steps, a
checkpoint every 20, the fault at step 110. The fault's rank moves to where a rank-local fault is
hardest to see among many: the garbage batch on rank 11, the NaN on rank 13 (the 2-rank overflow
drill hits every rank), the killed process rank 5.

1. One local Ray with enough logical CPUs for the ranks (``cluster.needed_cpus``); every rank
   writes the records it sends to the drills' trace.
2. The scenarios run through the drill runner (``supervisor.drills.runner``): ``client.api.launch``
   as ``supervisor launch`` does, under the default policy, the clean one first as the loss
   reference; each is checked against its drill's expectations (incident, phenotype, top cause,
   the rank named, actions taken and not taken, final loss within 5% of clean).
3. Beside those, from the incident timelines and the per-rank traces: every directive the
   supervisor issued acknowledged by every rank, and every rank going back (a rollback or a group
   restart) from the same last step to the same step.

The last line reads ``real_ranks: ranks R, S/N scenarios handled, ...``; exit 0 when every
scenario passed. Results go to ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.drills.check import Check
from supervisor.drills.scenario import Expect, LoadedScenario, _merge, find_scenarios
from supervisor.drills.specs import parse_faults

MAX_STEPS = 180
FAULT_STEP = 110
KILLED_RANK = 5
GARBAGE_RANK = 11
NAN_RANK = 13

#: The job every scenario runs, deep-merged over the drills' base job.
JOB: dict[str, Any] = {
    "config": {
        "batch_size": 8,
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "seq_len": 32},
        "data": {"max_bytes_per_source": 100_000},
    },
    "checkpoint": {"every_steps": 20, "keep": 12},
    "max_steps": MAX_STEPS,
    # job.yaml knobs any user can set (defaults 0.05 / 0.1), as bench/matrix sets them: the
    # supervisor's idle loop and each rank's link wake less often, so 16 ranks' polling does not
    # take the 2 cores; records still go out every step and directives arrive by long poll.
    "runtime": {"loop_interval_s": 0.2, "poll_interval_s": 0.25},
}


@dataclass(frozen=True)
class Scenario:
    name: str
    drill: str
    """The drill of ``examples/drills/`` it widens: its expectations, with the rank moved."""
    faults: tuple[dict[str, Any], ...] = ()
    expect: tuple[tuple[str, Any], ...] = ()
    goes_back: bool = False
    """Every rank must go back to an earlier step (a rollback or a group restart)."""
    killed: int | None = None


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("clean", "clean"),
        Scenario(
            "lr_cured",
            "lr_spike",
            ({"kind": "lr_spike", "step": FAULT_STEP, "factor": 40},),
            (("rollbacks", 1),),
            goes_back=True,
        ),
        Scenario(
            "garbage_rank",
            "garbage_batch",
            ({"kind": "garbage_batch", "step": FAULT_STEP, "rank": GARBAGE_RANK},),
            (("first_rank", GARBAGE_RANK),),
        ),
        Scenario(
            "nan_rank",
            "overflow",
            ({"kind": "overflow", "step": FAULT_STEP, "rank": NAN_RANK},),
            (("first_rank", NAN_RANK),),
        ),
        Scenario(
            "kill_rank",
            "worker_kill",
            ({"kind": "worker_kill", "step": FAULT_STEP, "rank": KILLED_RANK},),
            # The newest checkpoint before the kill (every 20 steps).
            (("first_rank", KILLED_RANK), ("resumed_from", FAULT_STEP // 20 * 20)),
            goes_back=True,
            killed=KILLED_RANK,
        ),
    )
}


def widened(sc: Scenario, ranks: int, *, against_clean: bool = True) -> LoadedScenario:
    """The drill ``sc.drill`` with the job of this bench at ``ranks`` ranks and ``sc``'s faults;
    ``against_clean=False``: the final loss is not compared (no clean run is made for it)."""
    (drill,) = find_scenarios([sc.drill])
    job = _merge(drill.job_data, JOB)
    job["resources"] = {"num_workers": ranks, "cpus_per_worker": 0.25}
    job["faults"] = [dict(f) for f in sc.faults]
    expect = Expect.model_validate(
        {**drill.expect.model_dump(), **dict(sc.expect)}
        | ({} if against_clean else {"final_loss_tolerance": None})
    )
    scenario = drill.scenario.model_copy(
        update={"name": sc.name, "faults": job["faults"], "expect": expect, "timeout_s": 900.0}
    )
    return LoadedScenario(drill.path, scenario, job, parse_faults(job["faults"], source=sc.name))


# -- what every rank did, from the timelines and the traces -------------------------------------
def regressions(records: Iterable[dict[str, Any]]) -> dict[int, list[tuple[int, int]]]:
    """Per rank, each time its steps went back: (the last step it reached, the step it went on from)."""
    last: dict[int, int] = {}
    out: dict[int, list[tuple[int, int]]] = {}
    for rec in records:
        rank, step = int(rec.get("rank", 0)), int(rec["step"])
        if rank in last and step <= last[rank]:
            out.setdefault(rank, []).append((last[rank], step - 1))
        last[rank] = step
    return out


def same_step(
    backs: dict[int, list[tuple[int, int]]], ranks: int, expected: bool, killed: int | None
) -> Check:
    """Every rank went back as often, to the same step, from the same last step (a killed rank
    may have stopped a step earlier: it died at the top of a step its peers waited in)."""
    if not expected:
        ok = not backs
        return Check("same_step", ok, "no rank went back" if ok else f"ranks went back: {_moves(backs)}")
    missing = sorted(set(range(ranks)) - set(backs))
    if missing:
        return Check(
            "same_step", False, f"rank(s) {missing} never went back ({len(backs)} did: {_moves(backs)})"
        )
    targets = {tuple(t for _, t in moves) for moves in backs.values()}
    froms = {tuple(f for f, _ in moves) for r, moves in backs.items() if r != killed}
    ok = len(targets) == 1 and len(froms) == 1
    return Check("same_step", ok, f"{ranks} ranks: {_moves(backs)}")


def _moves(backs: dict[int, list[tuple[int, int]]]) -> str:
    shapes: dict[str, list[int]] = {}
    for rank, moves in sorted(backs.items()):
        shapes.setdefault(", ".join(f"{f}->{t}" for f, t in moves), []).append(rank)
    return "; ".join(f"{shape} (ranks {_ranges(rs)})" for shape, rs in shapes.items())


def _ranges(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def acked_by_all(timelines: list[list[Any]], primary: list[Any], ranks: int) -> tuple[Check, dict[str, Any]]:
    """Every directive action done in any incident was acknowledged by every rank; and when the
    ``primary`` incident's timeline froze the ranks, at which step and how long after detection."""
    from supervisor.incidents import EventKind, EventStatus

    done = [e for tl in timelines for e in tl if e.status is EventStatus.DONE and "ranks" in (e.result or {})]
    short = [e for e in done if sorted(e.result["ranks"]) != list(range(ranks))]
    froze = next((e for e in primary if e.kind is EventKind.FROZE and e in done), None)
    detected = next((e for e in primary if e.kind is EventKind.DETECTED), None)
    facts: dict[str, Any] = {"directives": len(done)}
    if froze is not None:
        # The freeze is issued when a plan calls for it (an LR jump's first plan may only alert):
        # issued -> every rank acknowledged is the fan-out; detected -> frozen includes the plan.
        facts["frozen_at"], facts["freeze_issued_at"] = froze.result.get("acked_at_step"), froze.step
        facts["fanout_s"] = round((froze.finished_at or froze.wall_time) - froze.wall_time, 2)
        if detected is not None and detected.step is not None and facts["frozen_at"] is not None:
            facts["frozen_steps"] = int(facts["frozen_at"]) - int(detected.step)
            facts["frozen_s"] = round((froze.finished_at or froze.wall_time) - detected.wall_time, 2)
    detail = f"{len(done)} directive(s), each acknowledged by all {ranks} ranks"
    if short:
        e = short[0]
        detail = f"{e.kind.value} at step {e.step} acknowledged by {len(e.result['ranks'])}/{ranks} ranks"
    return Check("acked_by_all", not short, detail), facts


@dataclass
class Row:
    name: str
    passed: bool
    phase: str | None
    wall_s: float
    checks: list[Check]
    incident: str = "none"
    rank: int | None = None
    frozen: str = "-"
    went_back: str = "-"
    loss: str = "-"
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def missed(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.ok is False]


def examine(sc: Scenario, loaded: LoadedScenario, result: Any, out: Path, ranks: int) -> Row:
    """The drill's own checks plus this bench's, read back from the run's stores."""
    from supervisor.drills import series
    from supervisor.incidents.paths import open_for_job

    job = loaded.job_spec((out / sc.name / "storage").resolve())
    records = series.read_trace(Path(job.storage.path), job.name, ranks)
    backs = regressions(records)
    with open_for_job(job) as store:
        incidents = sorted(store.list_incidents(job=job.name), key=lambda i: i.id)
        timelines = [store.timeline(i.id) for i in incidents]
    primary = next((i for i in incidents if (i.onset_step or 0) >= FAULT_STEP - 2), None)
    own = timelines[incidents.index(primary)] if primary is not None else []
    acked, facts = acked_by_all(timelines, own, ranks)
    checks = [*result.checks, same_step(backs, ranks, sc.goes_back, sc.killed), acked]
    row = Row(sc.name, result.passed and all(c.ok is not False for c in checks[-2:]), result.phase,
              round(result.wall_s), checks, facts=facts)  # fmt: skip
    if primary is not None:
        row.incident = f"{primary.phenotype}/{primary.top_cause} at {primary.onset_step}"
        row.rank = primary.diagnosis.first_rank if primary.diagnosis else None
    elif incidents:
        row.incident = f"{len(incidents)} before the fault"
    if "frozen_at" in facts:
        row.frozen = (
            f"{ranks}/{ranks} at {facts['frozen_at']}: issued at {facts['freeze_issued_at']}, all acked in "
            f"{facts['fanout_s']} s; {facts.get('frozen_steps')} steps / {facts.get('frozen_s')} s after detection"
        )
    if backs:
        row.went_back = _moves(backs)
    loss = next((c for c in result.checks if c.name == "final_loss"), None)
    row.loss = loss.detail.split(" (")[1].split(",")[0] if loss and " (" in loss.detail else "-"
    return row


def table(rows: list[Row]) -> str:
    out = [
        "| scenario | job | incident (phenotype/cause at onset) | rank named | frozen (ranks at step) "
        "| went back (last -> restored, ranks) | final loss vs clean | wall s | ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r.name} | {r.phase} | {r.incident} | {r.rank if r.rank is not None else '-'} | {r.frozen} "
                   f"| {r.went_back} | {r.loss} | {r.wall_s} | {'yes' if r.passed else '**no**'} |")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.real_ranks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="Repeatable (default: all).")
    ap.add_argument("--smoke", action="store_true", help="The garbage batch on rank 11 alone (tests/bench).")
    ap.add_argument("--out", type=Path, default=Path("runs/real_ranks"))
    ap.add_argument("--report", action="store_true", help="Print the table of the runs already in --out.")
    args = ap.parse_args(argv)
    if args.ranks <= max(NAN_RANK, GARBAGE_RANK, KILLED_RANK):
        print(
            f"error: --ranks: at least {NAN_RANK + 1} (the faults' ranks are 5, 11 and 13)", file=sys.stderr
        )
        return 2
    names = ["garbage_rank"] if args.smoke else (args.scenario or list(SCENARIOS))
    selected = [SCENARIOS[n] for n in SCENARIOS if n in names]
    loaded = [widened(sc, args.ranks, against_clean="clean" in names) for sc in selected]
    out = args.out.resolve()
    if args.report:
        rows = [
            examine(sc, ld, stored(out / sc.name), out, args.ranks)
            for sc, ld in zip(selected, loaded, strict=True)
        ]
    else:
        shutil.rmtree(out / "reference", ignore_errors=True)  # this invocation's clean run is the reference
        out.mkdir(parents=True, exist_ok=True)
        rows = run(selected, loaded, out, args.ranks)
    print(table(rows))
    for r in rows:
        for line in r.missed:
            print(f"  {r.name}: {line}")
    handled = sum(r.passed for r in rows)
    frozen = [r.facts["frozen_steps"] for r in rows if "frozen_steps" in r.facts]
    fanout = [r.facts["fanout_s"] for r in rows if "fanout_s" in r.facts]
    print(
        f"real_ranks: ranks {args.ranks}, {handled}/{len(rows)} scenarios handled, "
        f"frozen within {max(frozen) if frozen else '-'} steps of detection, "
        f"freeze fan-out {max(fanout) if fanout else '-'} s, "
        f"{sum(r.wall_s for r in rows)} s, load {os.getloadavg()[0]:.1f}"
    )
    (out / "results.json").write_text(json.dumps([{**r.__dict__, "checks": [c.__dict__ for c in r.checks]}
                                                  for r in rows], indent=1, default=str))  # fmt: skip
    return 0 if handled == len(rows) else 1


def stored(work: Path) -> Any:
    """The drill result a run left in ``work/result.json``."""
    from supervisor.drills.runner import DrillResult

    data = json.loads((work / "result.json").read_text(encoding="utf-8"))
    checks = [Check(c["name"], c["ok"], c["detail"]) for c in data["checks"]]
    return DrillResult(data["name"], "", checks, data["wall_s"], data["phase"], error=data["error"])


def run(selected: list[Scenario], loaded: list[LoadedScenario], out: Path, ranks: int) -> list[Row]:
    from supervisor.client.cluster import needed_cpus
    from supervisor.drills.runner import run_drills

    os.environ.setdefault("RAY_raylet_start_wait_time_s", "180")
    t0 = time.monotonic()

    def progress(res: Any) -> None:
        print(f"  {res.name}: {res.phase}, {'passed' if res.passed else 'missed'} in {res.wall_s:.0f} s "
              f"({time.monotonic() - t0:.0f} s so far)", file=sys.stderr, flush=True)  # fmt: skip

    cpus = needed_cpus(loaded[0].job_spec(out))
    results = run_drills(loaded, out_dir=out, on_result=progress, num_cpus=cpus, concurrency=1)
    return [examine(sc, ld, res, out, ranks) for sc, ld, res in zip(selected, loaded, results, strict=True)]


if __name__ == "__main__":
    raise SystemExit(main())
