"""Checkpoints: manifests, the store (commit, health, `latest`), verification, rollback targets, retention.

The torch side (``save_training_state`` / ``load_training_state``) lives in
``supervisor.checkpoint.training_state`` and is imported from there, so that the
supervisor can use the store without importing torch.
"""

from supervisor.checkpoint.adopt import adopt
from supervisor.checkpoint.lifecycle import (
    GcReport,
    RollbackTarget,
    collect_garbage,
    select_restart_target,
    select_rollback_target,
)
from supervisor.checkpoint.manifest import COMPONENTS, FileEntry, HealthChange, Manifest, Verification
from supervisor.checkpoint.store import BlockState, CheckpointStore, StoreSettings
from supervisor.checkpoint.verify import VerifyResult, verify

__all__ = [
    "COMPONENTS",
    "BlockState",
    "CheckpointStore",
    "FileEntry",
    "GcReport",
    "HealthChange",
    "Manifest",
    "RollbackTarget",
    "StoreSettings",
    "Verification",
    "VerifyResult",
    "adopt",
    "collect_garbage",
    "select_restart_target",
    "select_rollback_target",
    "verify",
]
