"""Fire drills: real faults injected into real training, and checks of how the supervisor responded.

Training side (imported by the worker through ``examples/tinylm/train.py``):
``specs`` (fault parameters, no torch) → ``faults`` (``FaultPlan``: the hook points and the
injector registry; injectors in ``inject_data`` / ``inject_train`` / ``inject_ops``) →
``glue`` (plan from the worker context, record stream, mixture dataset, replay view).

Driver side (``supervisor drill``): ``scenario`` (a job + its faults + expectations) →
``runner`` (launch on a local Ray through ``supervisor.client.api``) → ``check`` / ``series``
(what the incident store, checkpoint store and loss curve say, against the expectations).
"""
