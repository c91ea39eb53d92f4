"""bench/gpu_check.py --device cpu: the GPU check's path at tiny sizes prints its one table."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


def _table(out: str) -> dict[str, list[str]]:
    """Rows of the printed table by their first column (cells are separated by 2+ spaces)."""
    lines = out.strip().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("check"))
    assert set(lines[head + 1].replace(" ", "")) == {"-"}
    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line) for line in lines[head + 2 :])}


def test_probe_and_checkpoint_rows(tmp_path, capsys):
    rc = _module().main(["--device", "cpu", "--only", "probe,ckpt", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    rows = _table(out)
    assert rc == 0, out
    assert out.count("\ncheck ") == 1  # one table
    names = list(rows)
    assert names[:3] == [next(n for n in names if n.startswith("probe: plain step")), "probe: minimal probe",
                         "probe: default probe"]  # fmt: skip
    assert re.fullmatch(r"[+-]\d+\.\d\d % of a step", rows["probe: default probe"][0])
    for name in ("ckpt: DCP save (sync)", "ckpt: async save, blocked", "ckpt: verify", "ckpt: DCP restore"):
        measured, goal, verdict = rows[name]
        assert re.match(r"\d+\.\d+ s = \d+\.\d+x ", measured) and goal and verdict == "-"  # not judged on CPU
    assert not list(tmp_path.iterdir())  # the checkpoints are gone


def test_bad_arguments_are_one_line_and_exit_2(capsys):
    mod = _module()
    assert mod.main(["--only", "probe,gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'gpu'" in err
    if not mod.torch.cuda.is_available():
        assert mod.main(["--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow  # two supervised runs side by side on a local Ray (a clean one and the LR fault): ~1 min
def test_supervised_job_rows(tmp_path, capsys):
    rc = _module().main(["--device", "cpu", "--only", "job", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    rows = _table(out)
    assert rc == 0, out
    assert rows["job: clean run (gloo, world size 1)"][-1] == "ok"
    assert rows["job: periodic saves"] == ["0 failed", "none failed", "ok"]
    assert (
        rows["job: LR fault, rollback"][0].endswith("(in_place)")
        and rows["job: LR fault, rollback"][-1] == "ok"
    )
    assert rows["job: LR fault, final loss vs clean"][-1] == "ok"
