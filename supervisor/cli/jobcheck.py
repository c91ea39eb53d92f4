"""Checks of a job.yaml beyond its schema, shared by `validate` and `launch`.

The schema (``supervisor.config.job``) checks each field alone; here the job is checked
against the world: its policy file exists, loads, and lies inside an allowed folder; each
drill fault names a registered kind with valid parameters.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from supervisor.config.job import JobSpec, check_job_file
from supervisor.config.loader import apply_overrides, read_yaml
from supervisor.errors import ConfigError, SupervisorError

ENV_POLICY_DIRS = "SUPERVISOR_POLICY_DIRS"
"""Extra folders (os.pathsep-separated) that policy files may live in."""


def allowed_policy_dirs(job_file: Path) -> list[Path]:
    """Where a job's policy file may be: the job's folder, the working directory, the shipped
    policies and ``$SUPERVISOR_POLICY_DIRS``; each with its subfolders."""
    from supervisor.core.policy.loader import shipped_dir

    dirs = [job_file.resolve().parent, Path.cwd().resolve()]
    shipped = shipped_dir()
    if shipped is not None:
        dirs.append(shipped.resolve())
    dirs += [
        Path(d).expanduser().resolve() for d in os.environ.get(ENV_POLICY_DIRS, "").split(os.pathsep) if d
    ]
    return list(dict.fromkeys(dirs))  # the job's folder is often the working directory


def policy_problems(policy: str, job_file: Path) -> list[SupervisorError]:
    from supervisor.core.policy.loader import load_policy, resolve_policy_path

    source = str(job_file)
    try:
        path = resolve_policy_path(policy)
    except SupervisorError as exc:
        return [ConfigError(exc.message, source=source, field="policy")]
    real = path.expanduser().resolve()
    allowed = allowed_policy_dirs(job_file)
    if not any(real.is_relative_to(d) for d in allowed):
        return [
            ConfigError(
                f"{policy!r} resolves to {real}, outside the allowed folders "
                f"({', '.join(str(d) for d in allowed)}); copy it there or add its folder to ${ENV_POLICY_DIRS}",
                source=source,
                field="policy",
            )
        ]
    try:
        load_policy(path)
    except SupervisorError as exc:
        return [exc]
    return []


def fault_problems(faults: list[Any], job_file: Path, skip: Collection[int] = ()) -> list[SupervisorError]:
    """Each fault (except indexes in ``skip``, already reported) names a registered kind with valid parameters."""
    from supervisor.drills.specs import parse_fault

    out: list[SupervisorError] = []
    for i, fault in enumerate(faults):
        if i in skip:
            continue
        try:
            parse_fault(fault, source=str(job_file), where=f"faults.{i}")
        except SupervisorError as exc:
            out.append(exc)
    return out


def entrypoint_problems(job: JobSpec, job_file: Path) -> list[SupervisorError]:
    """A script the entrypoint names (``train.py``, ``python train.py ...``) exists relative to the
    working directory, where `launch` runs and the ranks start (not relative to the job file: a
    script found only next to it is named in the error, with the two ways to fix it); else
    `launch` would start Ray and its workers only to fail there. Checked only for a fresh local Ray without code shipped
    by ``ray.runtime_env`` (a cluster may hold files this machine lacks); modules are not
    imported here (a package's ``__init__`` may be heavy)."""
    if job.ray.address not in (None, "local") or {"working_dir", "py_modules"} & set(job.ray.runtime_env):
        return []
    try:
        argv = shlex.split(job.entrypoint)
    except ValueError:
        return []
    if argv and argv[0] in ("python", "python3"):
        argv = argv[1:]
    script = argv[0] if argv and argv[0].endswith(".py") else None
    if script is None or (Path.cwd() / script).is_file():
        return []
    beside = job_file.parent / script
    if beside.is_file():
        return [ConfigError(f"script {script!r} is next to the job file but not in {Path.cwd()}, where `launch` runs "
                            f"and the ranks start: a relative entrypoint is relative to that directory; run `launch` "
                            f"from {job_file.parent.resolve()} or name the script as {_named(beside)}",
                            source=str(job_file), field="entrypoint")]  # fmt: skip
    return [ConfigError(f"script {script!r} not found in {Path.cwd()} (where `launch` runs and the ranks start; "
                        "a relative entrypoint is relative to it)", source=str(job_file), field="entrypoint")]  # fmt: skip


def _named(path: Path) -> str:
    """How the entrypoint would name ``path`` from here: relative when below, else absolute."""
    rel = os.path.relpath(path)
    return str(path.resolve()) if rel.startswith("..") else rel


def check_job(job_file: Path, overrides: Sequence[str] = ()) -> tuple[JobSpec | None, list[SupervisorError]]:
    """(job, []) when the job file is good; else every problem found, each one line.

    The policy and the faults are checked even when other fields fail the schema."""
    try:
        data = apply_overrides(read_yaml(job_file), overrides)
    except SupervisorError as exc:
        return None, [exc]
    job, problems = check_job_file(job_file, data=data)
    found: list[SupervisorError] = list(problems)
    bad = [p.field.split(".") for p in problems if p.field]
    raw = data if isinstance(data, dict) else {}
    policy = raw.get("policy", "default")
    if isinstance(policy, str) and not any(f[0] == "policy" for f in bad):
        found += policy_problems(policy, job_file)
    if job is not None:
        found += entrypoint_problems(job, job_file)
    faults = raw.get("faults")
    if isinstance(faults, list) and ["faults"] not in bad:
        reported = {int(f[1]) for f in bad if f[0] == "faults" and len(f) > 1 and f[1].isdigit()}
        found += fault_problems(faults, job_file, reported)
    return (job if not found else None), found


def load_checked_job(job_file: Path, overrides: Sequence[str] = ()) -> JobSpec:
    """The job, or the first problem raised (for commands that stop at one)."""
    job, problems = check_job(job_file, overrides)
    if job is None:
        raise problems[0]
    return job
