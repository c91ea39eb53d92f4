"""The end of a run, judged like any other step: evidence no later step can confirm.

Mid-run, an update ratio out of its band is confirmed by what follows: the loss of the next step
(rule 3, ``trigger.decide``) or two more steps out of band (rule 8). At the last step of a run
nothing follows, so a fault that struck in the last step or two would never be seen -- yet the
final weights carry its oversized update, and the final checkpoint holds them. ``judge_end``
therefore judges the trailing run as it stands: the update ratio out of band
(``grad_z_threshold``) at the last step, for fewer steps than rule 8 needs, opens an incident
that is ready at once (no step will come to confirm or refute it). A run of three or more steps
was the mid-run rules' to judge. The supervisor's own window (a fix it observes, its re-warm) is
exempt, as an optimizer-only signal is mid-run. Without an update ratio in the records there
is nothing at the end to judge: a grad norm alone, clipped, is no oversized update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from supervisor.core.detect import Signals
from supervisor.core.trigger import Trigger

if TYPE_CHECKING:
    from supervisor.core.analysis import IncidentUpdate, StreamingAnalyzer

#: Steps out of band that rule 8 (``trigger.decide``: the gradients for 3 steps in a row) needs.
GRAD_RUN = 3


def trailing_update_run(recent: Iterable[Signals], threshold: float) -> int:
    """How many steps in a row, up to the last one, have the update ratio at or above ``threshold``."""
    run, prev = 0, None
    for sig in reversed(list(recent)):
        z = sig.update_z
        if z is None or math.isnan(z) or z < threshold or (prev is not None and prev - sig.step > 1):
            break
        run, prev = run + 1, sig.step
    return run


def judge_end(analyzer: StreamingAnalyzer) -> list[IncidentUpdate]:
    """``analyzer`` has seen the last step: open the incident its trailing evidence makes, ready at
    once; returns the updates (none when the end is clean)."""
    st = analyzer.settings
    if analyzer.open is not None or not analyzer.recent:
        return []
    sig = analyzer.recent[-1]
    if sig.step != analyzer.last_step or not sig.ready:
        return []  # the last step was set aside (a skipped batch), or too little history to judge
    if analyzer.observing(sig.step):
        return []
    run = trailing_update_run(analyzer.recent, st.grad_z_threshold)
    if not 0 < run < GRAD_RUN:
        return []
    inc = analyzer._new_incident(sig, Trigger("grad", True))
    analyzer.incidents.append(inc)
    analyzer.open = inc
    inc.observe(sig, analyzer._in_band(inc, sig), st)
    inc.ready = True
    return [analyzer._update("opened", inc), analyzer._update("ready", inc)]


__all__ = ["GRAD_RUN", "judge_end", "trailing_update_run"]
