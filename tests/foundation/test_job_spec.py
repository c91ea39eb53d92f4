"""job.yaml validation: good files pass, every kind of bad file is one line + exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.cli.main import cli
from supervisor.config.job import JobSpec, load_job
from supervisor.errors import ConfigError

VALID = {
    "name": "tiny",
    "entrypoint": "examples.tinylm.train:main",
    "storage": {"path": "runs"},
    "max_steps": 100,
    "resources": {"num_workers": 2, "cpus_per_worker": 1},
}


def _write(tmp_path: Path, text: str | bytes, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def _run(path: Path) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["validate", str(path)])
    return res.exit_code, res.output


def test_valid_job_round_trips(tmp_path: Path) -> None:
    job = load_job(_write(tmp_path, yaml.safe_dump(VALID)))
    assert job.resources.num_workers == 2
    assert job.ray.address is None and job.checkpoint.every_steps == 100
    assert not job.storage.is_s3


def test_error_names_file_field_and_bound(tmp_path: Path) -> None:
    bad = dict(VALID, resources={"num_workers": 0})
    code, out = _run(_write(tmp_path, yaml.safe_dump(bad)))
    assert code == 2
    assert out.strip() == f"error: {tmp_path / 'job.yaml'}: resources.num_workers: must be >= 1 (got 0)"


def test_unknown_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_job(_write(tmp_path, yaml.safe_dump(dict(VALID, checkpoints={"every": 3}))))
    assert exc.value.field == "checkpoints" and "unknown key" in str(exc.value)


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    code, out = _run(_write(tmp_path, "name: tiny\nstorage: {path: [x\nmax_steps: 3\n"))
    assert code == 2
    assert "line 3, column" in out and "job.yaml" in out


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "file is empty"),
        ("- a\n- b\n", "expected a mapping"),
        (b"\x00\x01\xff\xfe", "not UTF-8"),
        (b"name: x\x00", "binary"),
    ],
)
def test_degenerate_files(tmp_path: Path, content: str | bytes, needle: str) -> None:
    code, out = _run(_write(tmp_path, content))
    assert code == 2 and needle in out


def test_missing_file(tmp_path: Path) -> None:
    code, out = _run(tmp_path / "absent.yaml")
    assert code == 2 and "absent.yaml" in out and "not found" in out


def test_s3_storage_path_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"storage\.path"):
        load_job(_write(tmp_path, yaml.safe_dump(dict(VALID, storage={"path": "s3://A_B"}))))
    job = load_job(_write(tmp_path, yaml.safe_dump(dict(VALID, storage={"path": "s3://bucket/p"}))))
    assert job.storage.is_s3


_junk_value = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=8),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)  # fmt: skip


@st.composite
def _malformed_job(draw: st.DrawFn) -> str | bytes:
    kind = draw(st.sampled_from(["wrong_type", "unknown_key", "missing", "bad_yaml", "binary"]))
    doc = dict(VALID)
    if kind == "wrong_type":
        key = draw(st.sampled_from(["name", "max_steps", "resources", "storage", "checkpoint"]))
        wrong = {"name": str, "max_steps": int}.get(key, dict)
        doc[key] = draw(_junk_value.filter(lambda v: type(v) is not wrong))
    elif kind == "unknown_key":
        doc[
            draw(
                st.text("abcdefghij_", min_size=1, max_size=10).filter(
                    lambda k: k not in JobSpec.model_fields
                )
            )
        ] = 1
    elif kind == "missing":
        doc.pop(draw(st.sampled_from(["name", "entrypoint", "storage", "max_steps"])))
    elif kind == "bad_yaml":
        return yaml.safe_dump(doc) + draw(
            st.sampled_from(["  - [unclosed\n", "\tbad: tab\n", "x: 'open\n", ": :\n"])
        )
    else:
        return draw(st.binary(min_size=1, max_size=64).filter(lambda b: b"\x00" in b or not _is_utf8(b)))
    return yaml.safe_dump(doc)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=_malformed_job())
def test_malformed_jobs_fail_cleanly(tmp_path: Path, content: str | bytes) -> None:
    path = _write(tmp_path, content)
    code, out = _run(path)
    lines = out.strip().splitlines()
    assert code == 2, out
    assert lines and all(line.startswith(f"error: {path}") for line in lines)
    assert "Traceback" not in out


def test_real_process_has_no_traceback(tmp_path: Path) -> None:
    """The console script itself (not CliRunner): one line per problem, every problem listed, exit 2."""
    path = _write(tmp_path, "name: 3\nmax_steps: -1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.main", "validate", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert all(line.startswith(f"error: {path}: ") for line in lines)
    assert [line.split(": ")[2] for line in lines] == ["name", "entrypoint", "storage", "max_steps"]
