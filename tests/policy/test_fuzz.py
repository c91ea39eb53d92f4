"""Hypothesis: malformed policy files always give exit 2 and one line naming the file — never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.cli.main import cli

from .conftest import POLICIES

VALID: dict[str, Any] = yaml.safe_load((POLICIES / "default.yaml").read_text())
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

junk = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
)


def _mappings(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every mapping in the document (where an unknown key is always an error)."""
    out = []
    if isinstance(node, dict):
        out.append(path)
        for k, v in node.items():
            out += _mappings(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _mappings(v, (*path, i))
    return out


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _assert_one_line_error(tmp_path: Path, text: str | bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    res = CliRunner().invoke(cli, ["policy", "validate", str(path)])
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit)
    lines = res.stderr.splitlines()  # every problem, one line each, each naming the file
    assert lines and all(line.startswith(f"error: {path}: ") for line in lines), res.stderr
    assert len(lines) == len(set(lines)), res.stderr
    assert "Traceback" not in res.output


@FUZZ
@given(data=st.data(), key=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10))
def test_unknown_key_anywhere(tmp_path: Path, data: st.DataObject, key: str) -> None:
    doc = copy.deepcopy(VALID)
    target = _at(doc, data.draw(st.sampled_from(_mappings(doc))))
    if key in target or key in {"on_failure"} or (len(target) == 1 and key in ("apply", "rollback")):
        key = f"zz_{key}"
    target[key] = data.draw(junk)
    _assert_one_line_error(tmp_path, yaml.safe_dump(doc))


@FUZZ
@given(rule=st.integers(0, len(VALID["rules"]) - 1), data=st.data())
def test_bad_action_name(tmp_path: Path, rule: int, data: st.DataObject) -> None:
    doc = copy.deepcopy(VALID)
    actions = doc["rules"][rule]["actions"]
    i = data.draw(st.integers(0, len(actions) - 1))
    name = data.draw(st.text(min_size=1, max_size=12).filter(lambda s: s not in {"alert", "apply", "freeze"}))
    actions[i] = data.draw(st.sampled_from([name, {name: {}}, {name: None}]))
    from supervisor.core.policy import ACTIONS

    if name in ACTIONS:
        actions[i] = {name: {"zz_bogus": 1}}
    _assert_one_line_error(tmp_path, yaml.safe_dump(doc))


@FUZZ
@given(
    field=st.sampled_from(["version", "name", "rules", "defaults.max_attempts", "defaults.cooldown_steps"]),
    value=st.one_of(
        st.integers(-5, -1), st.text(alphabet="xyz", max_size=5), st.lists(st.none(), max_size=2), st.none()
    ),
    drop=st.booleans(),
)
def test_bad_or_missing_top_level_field(tmp_path: Path, field: str, value: Any, drop: bool) -> None:
    doc = copy.deepcopy(VALID)
    *parents, last = field.split(".")
    target = _at(doc, tuple(parents))
    if drop and not parents:
        del target[last]
    else:
        target[last] = value
    if field == "name" and isinstance(value, str):
        target[last] = 5  # any string is a valid name; a number is not
    _assert_one_line_error(tmp_path, yaml.safe_dump(doc))


@FUZZ
@given(text=st.one_of(st.text(max_size=80), st.binary(max_size=40)))
def test_garbage_files(tmp_path: Path, text: str | bytes) -> None:
    _assert_one_line_error(tmp_path, text)


@pytest.mark.parametrize("content", ["", "[]", "- alert\n", "version: 1\n", "rules: {}\n"])
def test_small_invalid_documents(tmp_path: Path, content: str) -> None:
    _assert_one_line_error(tmp_path, content)
