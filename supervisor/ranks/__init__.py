"""What runs in each training rank's Ray actor: the worker actor, its link to the supervisor, a
command entrypoint's processes and their logs, and the names both sides find each other by; and
the job's own code run once outside the ranks, the offline replay task (``replay.py``).

It builds on ``config``, ``sdk`` and ``storage`` and never imports the supervisor's control loop
(``supervisor.runtime``), which starts these actors and talks to them only through Ray.
"""
