"""The supervisor's side: the control loop, the worker group on Ray, the supervisor actor, actions.

It wires the pure core (detection, policy) to the storage, checkpoint, incident and rank-side
(:mod:`supervisor.ranks`) adapters, and runs inside the supervisor actor; the launching process
reaches it through :mod:`supervisor.client`.
"""
