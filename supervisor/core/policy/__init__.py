"""Declarative rollback policies: schema, action registry, and the pure planning engine.

Usage: ``policy = load_policy("default")`` (a shipped name or a YAML path), then
``plan(diagnosis, JobState(step=...), policy)`` gives a ``Plan`` whose ``to_json()`` is
recorded in the incident timeline before any action runs.
"""

from supervisor.core.policy.actions import ACTIONS, ActionKind, ActionParams, action_names, get_action
from supervisor.core.policy.engine import plan, select_rule
from supervisor.core.policy.loader import load_policy, resolve_policy_path, shipped_policies
from supervisor.core.policy.match import METRICS, Match
from supervisor.core.policy.plan import CheckpointRef, JobState, Plan, PlannedAction
from supervisor.core.policy.schema import ActionSpec, Limits, Policy, Rule, policy_schema

__all__ = [
    "ACTIONS",
    "METRICS",
    "ActionKind",
    "ActionParams",
    "ActionSpec",
    "CheckpointRef",
    "JobState",
    "Limits",
    "Match",
    "Plan",
    "PlannedAction",
    "Policy",
    "Rule",
    "action_names",
    "get_action",
    "load_policy",
    "plan",
    "policy_schema",
    "resolve_policy_path",
    "select_rule",
    "shipped_policies",
]
