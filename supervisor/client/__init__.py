"""What runs in the launching process (the CLI, a drill, a bench): find or start Ray, place the
supervisor actor where it must run, attach to it, ask its status, stop it.

The control loop itself runs inside that actor (:mod:`supervisor.runtime`); the client reaches it
only through Ray. Entry points: ``launch`` / ``attach`` / ``stop`` in :mod:`supervisor.client.api`,
``connect`` in :mod:`supervisor.client.cluster`.
"""
