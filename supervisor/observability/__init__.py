"""The operator's view of a supervised job: alerts, metrics, training-logger sinks.

Each piece has a narrow interface the runtime calls in one line:

- ``alerts``: alert payloads (Slack-compatible or generic JSON) and their delivery.
"""
