"""Declarative rollback policies: schema, action registry, and the pure planning engine.

Usage: ``policy = load_policy("default")`` (a shipped name or a YAML path), then
``plan(diagnosis, JobState(step=...), policy)`` gives a ``Plan`` whose ``to_json()`` is
recorded in the incident timeline before any action runs.
"""

from supervisor.core.policy.actions import ACTIONS, action_names, get_action
from supervisor.core.policy.engine import plan
from supervisor.core.policy.loader import load_policy, resolve_policy_path, shipped_policies
from supervisor.core.policy.plan import JobState, Plan, PlannedAction
from supervisor.core.policy.schema import Policy, policy_schema

__all__ = [
    "ACTIONS",
    "JobState",
    "Plan",
    "PlannedAction",
    "Policy",
    "action_names",
    "get_action",
    "load_policy",
    "plan",
    "policy_schema",
    "resolve_policy_path",
    "shipped_policies",
]
