"""Fault specs: the registry, parameter validation, and errors that name the field."""

from __future__ import annotations

import pytest

from supervisor.config.job import JobSpec
from supervisor.drills.faults import INJECTORS, FaultPlan
from supervisor.drills.specs import FAULT_KINDS, GarbageBatch, LrSpike, fault_kind, parse_fault, parse_faults
from supervisor.errors import ConfigError


def test_unknown_kind_lists_valid_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        fault_kind("gremlins")
    assert "garbage_batch" in str(exc.value) and "worker_kill" in str(exc.value)


def test_parse_unknown_kind_names_field() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_fault({"kind": "nope", "step": 3}, source="drill.yaml", where="faults[2]")
    assert str(exc.value).startswith("drill.yaml: faults[2].kind: unknown fault kind 'nope'")


def test_bad_parameter_names_field_and_bound() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_faults([{"kind": "lr_spike", "step": 5, "factor": 0.5}])
    assert "faults[0].factor" in str(exc.value) and "> 1" in str(exc.value)


def test_unknown_parameter_is_an_error() -> None:
    with pytest.raises(ConfigError, match="faults\\[0\\].colour: unknown key"):
        parse_faults([{"kind": "garbage_batch", "step": 5, "colour": "red"}])


def test_missing_step_is_an_error() -> None:
    with pytest.raises(ConfigError, match="faults\\[0\\].step: required"):
        parse_faults([{"kind": "garbage_batch"}])


def test_specs_from_job_model_use_kind_defaults() -> None:
    job = JobSpec.model_validate(
        {
            "name": "j",
            "entrypoint": "a.b:c",
            "storage": {"path": "x"},
            "max_steps": 10,
            "faults": [{"kind": "garbage_batch", "step": 4}, {"kind": "lr_spike", "step": 7, "factor": 3.0}],
        }
    )
    garbage, spike = parse_faults(job.faults)
    assert isinstance(garbage, GarbageBatch) and garbage.rank == 0  # the kind's default, not "all ranks"
    assert isinstance(spike, LrSpike) and spike.rank is None and spike.factor == 3.0


def test_registry_and_injectors_agree() -> None:
    assert set(FAULT_KINDS) == set(INJECTORS)
    assert all(k.summary for k in FAULT_KINDS.values())


def test_plan_keeps_only_faults_of_its_rank() -> None:
    specs = [{"kind": "garbage_batch", "step": 1, "rank": 1}, {"kind": "lr_spike", "step": 2}]
    assert FaultPlan.from_specs(specs, rank=0, world_size=2).kinds == ["lr_spike"]
    assert FaultPlan.from_specs(specs, rank=1, world_size=2).kinds == ["garbage_batch", "lr_spike"]
    assert not FaultPlan.from_specs([], rank=0, world_size=2)
