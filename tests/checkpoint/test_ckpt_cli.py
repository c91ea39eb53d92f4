"""`supervisor checkpoints list | verify | mark` against real stores (local and S3)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from supervisor.checkpoint import CheckpointStore
from supervisor.cli.main import cli
from supervisor.core.model import HealthMark
from supervisor.storage import open_backend
from tests.checkpoint.conftest import entry_key, save_plain
from tests.s3support import fast_s3_settings, make_bucket


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--log-level", "error", *args])
    return result.exit_code, result.stdout, result.stderr


def _local(tmp_path: Path) -> tuple[str, CheckpointStore]:
    root = tmp_path / "storage"
    store = CheckpointStore(open_backend(str(root)), "job1")
    save_plain(store, 100)
    save_plain(store, 200)
    return str(root), store


def test_list_json_infers_the_only_job(tmp_path: Path) -> None:
    root, store = _local(tmp_path)
    store.block("spike", incident=3)
    code, out, _ = _run("checkpoints", "list", root, "--json")
    assert code == 0
    data = json.loads(out)
    assert [c["step"] for c in data["checkpoints"]] == [100, 200]
    assert data["latest"] == 200 and data["blocked_by"][0]["incident"] == "3"
    assert data["checkpoints"][1]["latest"] and data["checkpoints"][0]["health"] == "unverified"


def test_list_shows_a_replaced_quarantined_save_as_history(tmp_path: Path) -> None:
    root, store = _local(tmp_path)
    store.mark(200, HealthMark.QUARANTINED, "checksum mismatch")
    save_plain(store, 200)
    code, out, _ = _run("checkpoints", "list", root, "--json")
    row = json.loads(out)["checkpoints"][1]
    assert code == 0 and row["health"] == "unverified"
    assert [(r["health"], r["reason"]) for r in row["replaced"]] == [("quarantined", "checksum mismatch")]
    code, out, _ = _run("checkpoints", "list", root)
    assert code == 0 and "quarantined (checksum mismatch)" in out


def test_list_from_job_yaml(tmp_path: Path) -> None:
    root, _ = _local(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text(f"name: job1\nentrypoint: train.py\nmax_steps: 10\nstorage:\n  path: {root}\n")
    code, out, _ = _run("checkpoints", "list", str(job))
    assert code == 0 and "step       200" in out and "<- latest" in out


def test_verify_marks_and_fails_with_one_line_on_a_flipped_byte(tmp_path: Path) -> None:
    root, store = _local(tmp_path)
    key = entry_key(store, 200, "model")
    data = bytearray(store.backend.get_bytes(key))
    data[10] ^= 0xFF
    store.backend.put_bytes(key, bytes(data))
    code, out, err = _run("checkpoints", "verify", root, "--job", "job1")
    assert code == 1  # the check failed; 2 is kept for input a person must fix
    assert (
        err.strip().splitlines()[-1].startswith("error: ")
        and "step 200: " in err
        and "checksum mismatch" in err
    )
    assert "step 100: ok" in out
    assert store.manifest(100).health.value == "verified"
    assert store.manifest(200).health.value == "quarantined"


def test_mark_records_reason_and_refuses_invalid_transition(tmp_path: Path) -> None:
    root, store = _local(tmp_path)
    code, _, err = _run("checkpoints", "mark", root, "100", "healthy", "--reason", "looks fine")
    assert code == 2 and "cannot mark step 100 healthy: it is unverified" in err
    assert _run("checkpoints", "verify", root, "100")[0] == 0
    code, out, _ = _run("checkpoints", "mark", root, "100", "healthy", "--reason", "window clean", "--json")
    assert code == 0 and json.loads(out)["reason"] == "window clean"
    assert store.manifest(100).history[-1].reason == "window clean"


def test_missing_checkpoint_and_bad_path_exit_2(tmp_path: Path) -> None:
    root, _ = _local(tmp_path)
    code, _, err = _run("checkpoints", "verify", root, "150")
    assert code == 2 and "no checkpoint at step 150 (committed: 100, 200)" in err
    code, _, err = _run("checkpoints", "list", str(tmp_path / "nowhere"))
    assert code == 2 and "neither a job.yaml nor an existing storage directory" in err


def test_s3_list_and_missing_bucket(s3_endpoint: str, tmp_path: Path) -> None:
    uri = make_bucket(s3_endpoint) + "/runs"
    save_plain(CheckpointStore(open_backend(uri, settings=fast_s3_settings(s3_endpoint)), "job1"), 100)
    code, out, _ = _run("checkpoints", "list", uri, "--endpoint-url", s3_endpoint, "--json")
    assert code == 0 and json.loads(out)["checkpoints"][0]["step"] == 100
    code, _, err = _run(
        "checkpoints", "list", "s3://no-such-bucket/x", "--job", "job1", "--endpoint-url", s3_endpoint
    )
    assert code == 2 and err.strip() == "error: s3://no-such-bucket/x: bucket 'no-such-bucket' does not exist"


def test_gc_dry_run_then_delete(tmp_path: Path) -> None:
    root, store = _local(tmp_path)
    for step in (100, 200):
        assert _run("checkpoints", "verify", root, str(step))[0] == 0
        assert _run("checkpoints", "mark", root, str(step), "healthy", "--reason", "ok")[0] == 0
    code, out, _ = _run("checkpoints", "gc", root, "--keep", "1", "--dry-run", "--json")
    assert code == 0 and json.loads(out)["would_delete"] == [100] and store.steps() == [100, 200]
    assert "deleted" not in json.loads(out)  # issue 18: a dry run never reports anything as deleted
    code, out, _ = _run("checkpoints", "gc", root, "--keep", "1", "--dry-run")
    assert code == 0 and out.startswith("would delete [100]; kept [200]")
    code, out, _ = _run("checkpoints", "gc", root, "--keep", "1", "--protect", "100", "--json")
    assert code == 0 and json.loads(out)["deleted"] == [] and store.steps() == [100, 200]
    assert _run("checkpoints", "gc", root, "--keep", "1")[0] == 0
    assert store.steps() == [200]
