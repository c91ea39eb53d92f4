"""The runtime edge: the worker group on Ray, the telemetry channel, the supervisor actor, actions.

This is the only layer that imports Ray; it wires the pure core (detection, policy) to the
storage, checkpoint, incident and SDK adapters. Entry points: ``launch`` / ``attach`` in
:mod:`supervisor.runtime.api`.
"""
