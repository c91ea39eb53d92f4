"""`supervisor policy validate | explain | list`: check a policy and see what it would do."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from supervisor.cli.dryrun import ExplainedIncident, checkpoints_from_records, dry_run
from supervisor.cli.output import FiniteFloat, json_option, print_json
from supervisor.core.policy import load_policy, resolve_policy_path, shipped_policies
from supervisor.core.policy.loader import check_policy
from supervisor.core.policy.plan import CheckpointRef
from supervisor.errors import EXIT_BAD_INPUT, PolicyError


@click.group()
def policy() -> None:
    """Rollback policies: validate them and dry-run them against a trace."""


@policy.command()
@click.argument("files", nargs=-1, required=True)
@json_option
def validate(files: tuple[str, ...], as_json: bool) -> None:
    """Validate policy FILES (paths or shipped names).

    Every problem of every file is one line (`error: FILE: FIELD: what`); exit code 2 when any.
    """
    results = [_check(f) for f in files]
    if as_json:
        print_json(results)
    else:
        for r in results:
            if r["ok"]:
                rules = r["rules"]
                click.echo(f"ok {r['file']}: policy {r['name']!r}, {len(rules)} rules ({', '.join(rules)})")
            for line in r.get("errors", []):
                click.echo(f"error: {line}", err=True)
    if not all(r["ok"] for r in results):
        sys.exit(EXIT_BAD_INPUT)


def _check(name_or_path: str) -> dict[str, Any]:
    """One file's result: its rules, or every problem found in it (one line each)."""
    try:
        path = resolve_policy_path(name_or_path)
    except PolicyError as exc:
        return {"file": name_or_path, "ok": False, "errors": [exc.one_line()]}
    found, problems = check_policy(path)
    if found is None:
        return {"file": str(path), "ok": False, "errors": [p.one_line() for p in problems]}
    return {"file": str(path), "ok": True, "name": found.name, "rules": [r.name for r in found.rules]}


@policy.command(name="list")
def list_() -> None:
    """List the shipped policies."""
    for name in shipped_policies():
        p = load_policy(name)
        click.echo(f"{name:<18} {p.description}")


@policy.command()
@click.argument("file")
@click.option(
    "--trace",
    "trace_paths",
    required=True,
    multiple=True,
    type=click.Path(path_type=Path),
    help="The run to run detection on, as `analyze` reads it: a trace or training log, a run's "
    "folder, or one file per rank (repeat --trace).",
)
@click.option(
    "--format", "fmt", default="auto", show_default=True, help="Trace format (see `supervisor analyze`)."
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(1, 10**12),
    default=None,
    help="Assume a checkpoint every N steps (default: the trace's checkpoint_saved events, else 100).",
)
@click.option(
    "--grad-clip",
    type=FiniteFloat(0, 1e6),
    default=None,
    help="The job's grad clip (0: none), when its records do not log attrs.grad_clip.",
)
@click.option(
    "--supervision",
    type=click.Choice(["steer", "observe"]),
    default="steer",
    show_default=True,
    help="How deeply the job is supervised: steer (SDK step boundary) or observe (records only).",
)
@click.option("--no-replay-hooks", is_flag=True, help="The job has no replay_hooks (replay is not possible).")
@click.option(
    "--max-steps",
    type=click.IntRange(1, 10**12),
    default=None,
    help="The job's max_steps: a re-warm longer than the run left after the onset is dropped, "
    "as the live supervisor does (default: not known, the re-warm is kept).",
)
@click.option(
    "--recovery",
    type=click.Choice(["auto", "restart"]),
    default="auto",
    show_default=True,
    help="The job's job.yaml recovery: how a rollback is carried out (in place, or a worker-group restart).",
)
@json_option
def explain(
    file: str,
    trace_paths: tuple[Path, ...],
    fmt: str,
    checkpoint_every: int | None,
    grad_clip: float | None,
    supervision: str,
    no_replay_hooks: bool,
    max_steps: int | None,
    recovery: str,
    as_json: bool,
) -> None:
    """Run detection on the run (--trace: files or a folder) and print, per incident, the matched
    rule and the planned actions."""
    from supervisor.core.analysis import analyze_records
    from supervisor.traces import read_run

    pol = load_policy(file)
    trace = read_run(list(trace_paths), fmt)
    result = analyze_records(trace.records)
    checkpoints = checkpoints_from_records(trace.records, result.incidents, checkpoint_every)
    source = f"every {checkpoint_every} steps (assumed)" if checkpoint_every else "checkpoint_saved events"
    if not checkpoint_every and not checkpoints:
        checkpoints = checkpoints_from_records(trace.records, result.incidents, 100)
        source = "every 100 steps (assumed: the trace has no checkpoint_saved events)"
    explained = dry_run(
        pol,
        result.incidents,
        checkpoints,
        trace.records,
        grad_clip=grad_clip,
        checkpoint_every=checkpoint_every,
        supervision="observe" if supervision == "observe" else "steer",
        can_replay=False if no_replay_hooks else None,
        max_steps=max_steps,
    )
    if as_json:
        print_json(
            {
                "policy": pol.name,
                "policy_file": str(resolve_policy_path(file)),
                "trace": {
                    "path": str(trace_paths[0]),
                    "paths": [str(p) for p in trace_paths],
                    "format": trace.format,
                    "records": len(trace.records),
                },  # fmt: skip
                "skipped_lines": trace.skipped_lines,
                "checkpoints": {"source": source, "items": [c.to_json() for c in checkpoints]},
                "incidents": [e.to_json() | {"recovery_mode": _mode(e, recovery)} for e in explained],
            }
        )
        return
    label = ", ".join(str(p) for p in trace_paths)
    _print_text(pol.name, label, len(trace.records), checkpoints, source, explained, recovery)


def _print_text(
    policy_name: str,
    trace_label: str,
    n_records: int,
    checkpoints: tuple[CheckpointRef, ...],
    source: str,
    explained: list[ExplainedIncident],
    recovery: str = "auto",
) -> None:
    click.echo(f"policy {policy_name!r} on {trace_label} ({n_records} records)")
    marks = ", ".join(f"{c.step} {c.mark.value}" for c in checkpoints[-6:]) or "none"
    click.echo(f"checkpoints from {source}: {len(checkpoints)} (latest: {marks})")
    if not explained:
        click.echo("no incidents detected: nothing to plan")
    for e in explained:
        click.echo("")
        _print_incident(e, recovery)


def _mode(e: ExplainedIncident, recovery: str) -> dict[str, str] | None:
    """How this plan's rollback is carried out, and why (``config.recovery``); None: no rollback."""
    from supervisor.config.recovery import rollback_mode

    if e.plan.recovery == "none":
        return None
    if e.plan.recovery == "restart":  # observe level: nothing to load state into at a step boundary
        return {"mode": "restart", "why": "an observe-level job has no step-boundary control"}
    mode, why = rollback_mode(recovery, None if recovery == "auto" else False)
    return {"mode": mode, "why": why}


def _print_incident(e: ExplainedIncident, recovery: str = "auto") -> None:
    d, p = e.diagnosis, e.plan
    end = "open" if d.end_step is None else str(d.end_step)
    causes = ", ".join(f"{c.cause.value} {c.score:.2f}" for c in d.causes[:3]) or "none"
    click.echo(
        f"incident {e.index}: {d.phenotype.value} from step {d.onset_step} (peak {d.peak_step}, end {end}, "
        f"detected {d.detected_step}) severity {d.severity.value}"
    )
    click.echo(f"  attributes: {', '.join(d.attributes) or 'none'}; causes: {causes}")
    click.echo(f"  {p.matched_because} (attempt {p.attempt})")
    s = e.state
    known = ", ".join(
        f"{k} {v:.3g}" if v is not None else f"{k} unknown"
        for k, v in (("lr", s.lr), ("grad clip", s.grad_clip), ("median grad norm", s.grad_norm))
    )
    mode = _mode(e, recovery)  # in place or a restart, and why (docs/integrations.md, "Recovery")
    shown = mode["mode"] if mode else p.recovery
    click.echo(f"  job runs: {known}; supervision {p.supervision}, recovery {shown.replace('_', '-')}")
    if mode:
        click.echo(f"  recovery: {mode['why']}")
    if p.passed_over:  # the reasons are in --json ("passed_over")
        click.echo(f"  passed over: {', '.join(rule for rule, _ in p.passed_over)}")
    for i, a in enumerate(p.actions, 1):
        click.echo(f"  {i}. {a.name:<12} {a.reason}  [on failure: {a.on_failure}]")
    names = p.action_names
    if "observe" in names and not p.escalates:
        after = "resume" if "resume" in names[names.index("observe") :] else "continue"
        fail = next(a.on_failure for a in p.actions if a.name == "observe")
        click.echo(f"  then: {after} if the observation window passes, else {fail}")
    if p.escalate_reason:
        click.echo(f"  escalates: {p.escalate_reason}")
    for note in p.notes:
        click.echo(f"  note: {note}")
