"""Validated configuration files: job.yaml (here) and policies (supervisor.core.policy)."""

from supervisor.config.job import JobSpec, load_job
from supervisor.config.loader import load_model, read_yaml

__all__ = ["JobSpec", "load_job", "load_model", "read_yaml"]
