"""A user's training script: optionally sets up its own logging, then uses the SDK offline.

Prints one JSON line on stdout: the host's logging setup before and after the SDK ran, and
what the host's own handler received. ``python host_logging.py bare|configured``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import structlog

seen: list[str] = []


class Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        seen.append(record.getMessage())


def setup() -> dict[str, Any]:
    root = logging.getLogger()
    return {
        "root_handlers": [id(h) for h in root.handlers],
        "root_level": root.level,
        "structlog_configured": structlog.is_configured(),
        "structlog_config": {k: repr(v) for k, v in sorted(structlog.get_config().items())},
        "supervisor_handlers": len(logging.getLogger("supervisor").handlers),
    }


def main() -> None:
    mode = sys.argv[1]
    if mode == "configured":
        logging.basicConfig(level=logging.INFO, handlers=[Keep()])
        structlog.configure(processors=[structlog.processors.KeyValueRenderer()])
    before = setup()

    import torch

    from supervisor import sdk

    def flaky_control() -> list[Any]:
        raise ConnectionError("control channel down")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sent: list[dict[str, Any]] = []
    transport = sdk.BatchingTransport(sent.extend, directives=flaky_control)
    probe = sdk.init(model, opt, transport=transport, max_steps=3)
    x = torch.randint(0, 11, (4, 6))
    for _ in range(3):
        if not probe.proceed():  # the step boundary polls the (failing) control channel
            break
        with probe.step({"input_ids": x}) as s:
            s.backward(sdk.token_losses(model(x[:, :-1]), x[:, 1:]))
            s.optimizer_step()
    probe.close()
    print(json.dumps({"before": before, "after": setup(), "seen": seen, "steps": [r["step"] for r in sent]}))


if __name__ == "__main__":
    main()
