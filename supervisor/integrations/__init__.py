"""Supervision for training code the SDK does not own: framework callbacks and their helpers.

- :mod:`supervisor.integrations.hf` — ``SupervisorCallback``, a ``transformers.TrainerCallback``
  (``pip install spike-supervisor[hf]``);
- :mod:`supervisor.integrations.lightning` — ``SupervisorCallback``, a
  ``lightning.pytorch.Callback`` (``pip install spike-supervisor[lightning]``);
- :mod:`supervisor.integrations.drills` — a job's drill faults on a watched optimizer step.

Each builds a probe with ``sdk.watch`` over the framework's live model, optimizer and
scheduler, so every directive is carried out in place at the step boundary (freeze,
snapshot, rollback, LR / clip overrides, stop) and a restarted group resumes from the
supervisor's verified checkpoint before the first step.
"""
