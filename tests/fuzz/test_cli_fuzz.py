"""Fuzz `analyze`, `validate`, `policy validate` and `policy explain` with hostile files (issue 18).

Reported: 29 tracebacks in 223 fuzzed runs, memory blow-ups and hangs. Each command must end
with exit code 0, 1 or 2 (never 3: nothing here is a backend failure), with no traceback,
within a deadline, and under an address-space limit. The commands run in one long-lived
worker process (``cli_worker.py``) so hundreds of examples fit in seconds; a hang or a crash
of that process fails the example and the worker is started afresh.
"""

from __future__ import annotations

import gzip
import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

WORKER = Path(__file__).with_name("cli_worker.py")
ROOT = Path(__file__).resolve().parents[2]
HEADROOM = 768 << 20  # bytes of address space an input may cost the process
DEADLINE_S = 20.0  # per command; generous for a busy 2-core machine (typical: milliseconds)
EXAMPLES = int(os.environ.get("SUPERVISOR_FUZZ_EXAMPLES", "100"))
# `make test` runs a fixed set of examples (no flaky CI); SUPERVISOR_FUZZ_RANDOM=1 explores new ones.
DERANDOMIZE = os.environ.get("SUPERVISOR_FUZZ_RANDOM") != "1"


class Worker:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(HEADROOM)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        )  # fmt: skip
        ready = self._read(120.0)
        assert ready is not None and ready.get("ready"), "fuzz worker did not start"

    def _read(self, timeout: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def run(self, args: list[str]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        result = self._read(DEADLINE_S)
        if result is None:
            self.stop()
            return {"code": None, "output": "", "traceback": "hung past the deadline or died", "peak_kb": 0}
        return result

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    w = Worker()
    w.start()
    yield w
    w.stop()


# -- hostile content --------------------------------------------------------------------------

_NUMBERISH = st.one_of(
    st.integers(),
    st.integers(min_value=10**25, max_value=10**32),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, 1e-300, 1e300, 1e30, -1.0, 0, 2**63, -(2**63)]),
    st.text(max_size=6),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_FIELDS = ["step", "rank", "world_size", "loss", "loss_sum", "tokens", "lr", "grad_norm", "param_norm",
           "update_norm", "loss_scale", "overflow", "nonfinite", "nonfinite_at", "sources", "samples",
           "seq_len_max", "step_time", "tokens_per_s", "param_checksum", "events", "attrs", "time"]  # fmt: skip


@st.composite
def _record(draw: st.DrawFn) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "step": draw(st.one_of(st.integers(0, 400), _NUMBERISH)),
        "loss": draw(st.one_of(st.floats(0.1, 10), _NUMBERISH)),
    }
    for name in draw(st.lists(st.sampled_from(_FIELDS), max_size=4)):
        if name == "sources":
            rec[name] = draw(
                st.one_of(
                    st.dictionaries(st.text(max_size=4), st.fixed_dictionaries({"tokens": _NUMBERISH, "loss_sum": _NUMBERISH}), max_size=3),
                    _NUMBERISH,
                )
            )  # fmt: skip
        else:
            rec[name] = draw(_NUMBERISH)
    return rec


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    lines = []
    for r in records:
        try:
            lines.append(json.dumps(r, default=str))
        except ValueError:  # ints past Python's str limit: write the digits ourselves
            lines.append(json.dumps({k: v for k, v in r.items() if not isinstance(v, int)}))
    return ("\n".join(lines) + "\n").encode()


@st.composite
def _trace(draw: st.DrawFn) -> bytes:
    base = [
        {"step": s, "loss": 3.0 - s / 200 + (s % 7) / 50, "rank": 0, "grad_norm": 1.0} for s in range(120)
    ]
    hostile = draw(st.lists(_record(), max_size=12))
    for rec in hostile:
        base.insert(draw(st.integers(0, len(base))), rec)
    return _jsonl(base)


def _deep(depth: int, open_: str, close: str, inner: str = "1") -> str:
    return open_ * depth + inner + close * depth


_JOB = {"name": "fz", "entrypoint": "m:f", "storage": {"path": "runs"}, "max_steps": 10}
_POLICY_KEYS = [
    "name",
    "description",
    "rules",
    "defaults",
    "match",
    "actions",
    "max_attempts",
    "cooldown_steps",
]


@st.composite
def _yaml_doc(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["job", "policy", "anything"]))
    value: Any
    if kind == "job":
        value = dict(_JOB)
        for key in draw(st.lists(st.sampled_from([*_JOB, "resources", "ray", "faults", "policy", "runtime",
                                                   "telemetry", "checkpoint", "mode", "config"]), max_size=4)):  # fmt: skip
            value[key] = draw(st.one_of(_NUMBERISH, st.dictionaries(st.sampled_from(["num_workers", "address", "kind", "step", "every_steps", "keep", "trace", "window"]), _NUMBERISH, max_size=3)))  # fmt: skip
    elif kind == "policy":
        value = {k: draw(_NUMBERISH) for k in draw(st.lists(st.sampled_from(_POLICY_KEYS), max_size=5))}
    else:
        value = draw(st.recursive(_NUMBERISH, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=20))  # fmt: skip
    try:
        return yaml.safe_dump(value).encode()
    except (ValueError, yaml.YAMLError):
        return b"name: [unclosed\n"


ATTACKS = [
    ("json-deep", (_deep(50_000, "[", "]") + "\n").encode()),
    ("json-deep-obj", (_deep(30_000, '{"a":', "}") + "\n").encode()),
    ("yaml-deep", ("name: x\nconfig: " + _deep(100_000, "[", "]") + "\n").encode()),
    ("laughs", ("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))).encode()),
    ("long-int", ('{"step": ' + "9" * 5000 + ', "loss": 1.0}\n').encode() * 3),
    ("long-int-yaml", ("name: x\nmax_steps: " + "9" * 5000 + "\n").encode()),
    ("huge-steps", b"".join(json.dumps({"step": s, "loss": 2.0}).encode() + b"\n" for s in (0, 1, 2, 10**30, 10**30 + 1))),
    ("huge-steps-float", b"".join(json.dumps({"step": s, "loss": 2.0}).encode() + b"\n" for s in (0, 1.0, 1e30, 1e308))),
    ("denormal-loss", b"".join(json.dumps({"step": s, "loss": 5e-324 if s == 60 else 3.0 - s / 100, "grad_norm": 1e308 if s == 70 else 1.0}).encode() + b"\n" for s in range(120))),
    ("tiny-vs-huge", b"".join(json.dumps({"step": s, "loss": 1e300 if s == 100 else 1e-300, "grad_norm": 1e300 if s == 100 else 1e-300, "update_norm": 1e-300, "param_norm": 1.0}).encode() + b"\n" for s in range(150))),
    ("huge-values", b"".join(json.dumps({"step": s, "loss": v}).encode() + b"\n" for s, v in enumerate([1e308] * 60 + [-1e308] * 60))),
    ("tokens-string", b"".join(json.dumps({"step": s, "loss": 2.0, "sources": {"a": {"tokens": "many", "loss_sum": "x"}}}).encode() + b"\n" for s in range(80))),
    ("nul", b"\x00" * 100),
    ("control-char", b"\x01"),
    ("empty", b""),
    ("csv", b"step,loss\n" + b"".join(f"{s},{'nan' if s % 5 else 1e308}\n".encode() for s in range(100))),
    # issue 29: a short line nested past json's C decoder (10 KB, under every size limit)
    ("json-deep-line", b"".join(json.dumps({"step": s, "loss": 2.0}).encode() + b"\n" for s in range(60)) + b'{"step": 61, "loss": 1.0, "attrs": ' + _deep(5000, "[", "]").encode() + b"}\n"),
    ("hf-deep", b'{"log_history": ' + _deep(5000, "[", "]").encode() + b"}"),
    ("csv-deep-cell", b"step,loss,sources\n" + b"".join(f"{s},2.0,{{}}\n".encode() for s in range(60)) + b'61,1.0,"' + _deep(5000, "[", "]").encode() + b'"\n'),
    ("gzip-zero-padded", gzip.compress(b'{"step": 1, "loss": 2.0}\n' * 50) + b"\0" * (1 << 20)),
]  # fmt: skip
_ATTACKS = st.sampled_from(ATTACKS)


@st.composite
def _case(draw: st.DrawFn) -> tuple[str, bytes]:
    how = draw(st.sampled_from(["trace", "yaml", "attack", "bytes"]))
    if how == "trace":
        content = draw(_trace())
    elif how == "yaml":
        content = draw(_yaml_doc())
    elif how == "attack":
        content = draw(_ATTACKS)[1]
    else:
        content = draw(st.binary(max_size=300))
    if draw(st.booleans()) and draw(st.booleans()):  # a quarter of the inputs arrive gzipped
        content = gzip.compress(content)
        if draw(st.booleans()):
            content = content[: len(content) // 2] + b"\xff" * 8  # and some of those corrupt
    return how, content


COMMANDS = {
    "analyze": lambda f: ["analyze", f, "--json"],
    "validate": lambda f: ["validate", f],
    "policy-validate": lambda f: ["policy", "validate", f],
    "policy-explain": lambda f: ["policy", "explain", "default", "--trace", f],
}


def _check(worker: Worker, tmp: Path, command: str, content: bytes) -> None:
    path = tmp / ("input.yaml" if command in ("validate", "policy-validate") else "input.jsonl")
    path.write_bytes(content)
    result = worker.run(COMMANDS[command](str(path)))
    where = f"{command} on {content[:120]!r}... ({len(content)} bytes)"
    assert result["traceback"] is None, f"{where}\n{result['traceback']}"
    assert result["code"] in (0, 1, 2), f"{where}: exit {result['code']}\n{result['output']}"
    if result["code"] == 2:
        errors = [line for line in result["output"].splitlines() if line.startswith("error: ")]
        assert errors, f"{where}: exit 2 without an `error:` line\n{result['output']}"


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=list(HealthCheck),
)
@given(command=st.sampled_from(sorted(COMMANDS)), case=_case())
@example(command="analyze", case=("attack", (_deep(50_000, "[", "]") + "\n").encode()))
def test_no_traceback_no_hang_bounded_memory(
    worker: Worker, tmp_path_factory: pytest.TempPathFactory, command: str, case: tuple[str, bytes]
) -> None:
    _check(worker, tmp_path_factory.mktemp("fz", numbered=True), command, case[1])


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a[0])
def test_every_reported_attack(
    worker: Worker, tmp_path: Path, command: str, attack: tuple[str, bytes]
) -> None:
    _check(worker, tmp_path, command, attack[1])
