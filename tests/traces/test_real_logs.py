"""BigScience logbooks (shared/real-logs): parsed, and the evidence agrees with what the authors report.

Skipped when the folder is absent; the logs are read in place, never copied into the repo.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli

REAL = Path(__file__).resolve().parents[3] / "shared" / "real-logs"
PREFIX = "bigscience-workshop__bigscience__train__"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="shared/real-logs is absent")


def _analyze(run: str) -> dict[str, Any]:
    path = REAL / f"{PREFIX}{run}__chronicles.md"
    res = CliRunner().invoke(cli, ["analyze", "--json", str(path)])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _evidence(incident: dict[str, Any], cause: str) -> list[str]:
    return next((c["evidence"] for c in incident["causes"] if c["cause"] == cause), [])


def _near(out: dict[str, Any], peak: int, tol: int = 0) -> dict[str, Any]:
    found = [i for i in out["incidents"] if abs(i["peak_step"] - peak) <= tol]
    assert found, [(i["onset_step"], i["peak_step"]) for i in out["incidents"]]
    return found[0]


def test_bloom_176b_grad_norm_rises_before_the_31219_loss_spike() -> None:
    """'first lm loss spike' at 31219; grad norm 0.24 -> 960 rising ~4 steps before; recovered ~30 its."""
    out = _analyze("tr11-176B-ml")
    assert out["skipped_lines"] > 400  # the prose
    inc = _near(out, 31219)
    assert inc["first_anomaly"]["metric"] == "grad_norm"
    assert 31215 <= inc["onset_step"] <= 31216 < inc["peak_step"]
    assert inc["phenotype"] == "slow_recovery"
    assert inc["end_step"] == 31250  # the next excerpt is back at 2.2
    assert inc["causes"][0]["cause"] == "optimizer"
    assert any("before the loss peak at 31219" in e for e in _evidence(inc, "optimizer"))


def test_104b_grad_norm_explodes_one_step_before_the_11448_loss_spike() -> None:
    """11446-48: loss 3.1 -> 7.7 with grad norm 13k -> 263k one step earlier."""
    out = _analyze("tr8-104B-wide")
    inc = _near(out, 11448)
    assert inc["first_anomaly"]["metric"] == "grad_norm" and inc["first_anomaly"]["step"] == 11447
    assert inc["onset_step"] == 11447


def test_104b_repeated_spikes_8738_to_8743() -> None:
    out = _analyze("tr8-104B-wide")
    inc = _near(out, 8743, tol=2)
    assert 8738 <= inc["onset_step"] <= 8740
    assert inc["severity"] in ("high", "critical")


def test_104b_fp16_17062_spike_with_overflows_and_loss_scale_collapse() -> None:
    """17060-68: loss 2.67 -> 4.37 and stays; OVERFLOW lines; loss scale 1048576 -> 32768."""
    out = _analyze("tr8b-104B")
    inc = _near(out, 17065, tol=3)
    assert inc["onset_step"] == 17062
    assert inc["end_step"] is None  # it stays up to the end of the excerpt
    numeric = " ".join(_evidence(inc, "numeric"))
    assert "overflowed" in numeric and "1.05e+06 -> 3.28e+04" in numeric
    assert inc["causes"][0]["cause"] == "numeric"


def test_13b_spike_at_29050_with_absent_grad_norm_and_loss_scale_drop() -> None:
    """Logged every 10 its: 29050 loss 2.77 -> 7.34 -> 8.72; loss scale 65536 -> 4096; grad norm 0.000."""
    out = _analyze("tr1-13B-base")
    inc = _near(out, 29060)
    assert inc["onset_step"] == 29050
    assert inc["phenotype"] == "slow_recovery"
    assert inc["first_anomaly"]["metric"] == "loss"  # grad norm is printed as 0.000: absent, not zero
    assert any("6.55e+04 -> 4.1e+03" in e for e in _evidence(inc, "numeric"))


EVERY = sorted(p for p in REAL.rglob("*") if p.is_file() and p.name != "SOURCES.md") if REAL.is_dir() else []


@pytest.mark.parametrize("path", EVERY, ids=lambda p: p.name[:40])
def test_every_real_log_is_read_and_analyzed(path: Path) -> None:
    """Every file parses (prose and script lines skipped and counted). The modded-nanogpt files are
    healthy record runs with a heavy-tailed single-micro-batch loss: blips there are notes (low),
    never an incident the policy acts on."""
    healthy = path.parent.name == "modded-nanogpt"
    args = ["analyze", "--json", *(["--fail-on", "medium"] if healthy else []), str(path)]
    res = CliRunner().invoke(cli, args)
    out = json.loads(res.output)
    assert res.exit_code == 0, [(i["onset_step"], i["phenotype"], i["severity"]) for i in out["incidents"]]
    assert out["skipped_lines"] > 0 and isinstance(out["incidents"], list)
    if healthy:
        assert all(i["severity"] == "low" for i in out["incidents"])
