"""The operator's view of a supervised job: alerts, metrics, incident series, training-log sinks.

Each piece has a narrow interface; the runtime calls them in one line each:

- ``alerts``: alert payloads (Slack-compatible or generic JSON) and their delivery (the
  ``alert`` action);
- ``hub.Observability``: built with the controller, ``on_step(step, records, aggregate)``
  after each analysed step; it feeds ``series`` (per-rank and post-rollback rows of open
  incidents), ``metrics`` (Prometheus) and ``tensorboard`` (optional sink);
- ``hooks``: the training side's rollback hook for the user's own logger.
"""
