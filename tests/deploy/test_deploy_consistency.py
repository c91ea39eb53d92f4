"""deploy/ agrees with the code: YAML loads, every `supervisor ...` it runs exists with those
options, and the image installs what pyproject declares."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from supervisor.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
YAMLS = sorted(DEPLOY.rglob("*.yaml"))


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def _supervisor_commands(text: str) -> list[list[str]]:
    """Every `supervisor ...` invocation in a text (shell lines, YAML values, ExecStart=)."""
    found = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for m in re.finditer(r"(?:^|[\s=/\"'\[])supervisor(\s+[^;&|<>\n\"'\]]*)", line):
            args = shlex.split(m.group(1).replace("\\", " "))
            if args and not args[0].startswith(("/", ".")) and args[0] != "-":
                found.append(args)
    return found


def _check_args(args: list[str]) -> None:
    """Walk the click tree as the shell would: subcommands must exist, options must be known."""
    cmd: click.Command = cli
    i = 0
    while i < len(args):
        tok = args[i]
        if tok.startswith("-"):
            name = tok.split("=", 1)[0]
            param = next(
                (p for p in cmd.params if isinstance(p, click.Option) and name in p.opts + p.secondary_opts),
                None,
            )
            if name in ("-h", "--help"):
                return
            assert param is not None, f"`{cmd.name}` has no option {name} (in: supervisor {' '.join(args)})"
            i += 1 if (param.is_flag or "=" in tok) else 2
            continue
        if isinstance(cmd, click.Group):
            assert tok in cmd.commands, (
                f"no command `{tok}` under `{cmd.name}` (in: supervisor {' '.join(args)})"
            )
            cmd = cmd.commands[tok]
        i += 1


def _deploy_texts() -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(DEPLOY.rglob("*")) if p.is_file() and p.suffix != ".md"}


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_loads(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)


def test_every_supervisor_command_exists_with_its_options() -> None:
    seen = 0
    for path, text in _deploy_texts().items():
        texts = [text]
        if path.suffix == ".yaml":
            texts = [s for d in yaml.safe_load_all(text) for s in _strings(d)]
        for t in texts:
            for args in _supervisor_commands(t):
                _check_args(args)
                seen += 1
    assert seen >= 4, (
        "deploy/ should run the supervisor in the cluster config, RayJob, systemd unit and image"
    )


def test_job_in_configmap_validates(tmp_path: Path) -> None:
    from supervisor.config.job import load_job

    cm = yaml.safe_load((DEPLOY / "kuberay" / "job-configmap.yaml").read_text())
    (tmp_path / "job.yaml").write_text(cm["data"]["job.yaml"])
    job = load_job(tmp_path / "job.yaml")
    assert job.storage.is_s3 and job.ray.address == "auto" and job.resources.gpus_per_worker >= 1


def test_rayjob_uses_the_cluster_and_the_s3_secret() -> None:
    cluster = yaml.safe_load((DEPLOY / "kuberay" / "raycluster.yaml").read_text())
    job = yaml.safe_load((DEPLOY / "kuberay" / "rayjob.yaml").read_text())
    secret = yaml.safe_load((DEPLOY / "kuberay" / "s3-secret.example.yaml").read_text())
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    assert job["spec"]["entrypoint"].split()[0] == "supervisor"
    refs = [e["secretRef"]["name"] for s in _strings_containers(cluster) for e in s.get("envFrom", [])]
    assert refs and set(refs) == {secret["metadata"]["name"]}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret["stringData"])


def _strings_containers(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    spec = cluster["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_image_installs_the_package_with_declared_extras_and_a_torch_in_range() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"].get("optional-dependencies", {}))
    docker = (DEPLOY / "Dockerfile").read_text()
    installs = re.findall(r'pip install\s+"?\.(\[[^\]]*\])?"?(?:\s|$)', docker)
    assert installs, "the image must pip install the project itself"
    for group in installs:
        for extra in filter(None, group.strip("[]").split(",")):
            assert extra.strip() in extras, f"image installs extra {extra!r} that pyproject does not declare"
    torch_req = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch"))
    low = re.search(r">=\s*([\d.]+)", torch_req)
    pin = re.search(r'TORCH_SPEC="torch==([\d.]+)"', docker)
    assert low and pin
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(pin.group(1)) >= as_tuple(low.group(1)), "image torch is below pyproject's range"
    for src in ("supervisor", "policies", "pyproject.toml"):
        assert f"COPY {src}" in docker
