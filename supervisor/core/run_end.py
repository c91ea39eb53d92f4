"""The end of a run, judged like any other step: evidence no later step can confirm.

Mid-run, an update ratio out of band is confirmed by what follows (the next step's loss, or two
more steps out of band). After the last step nothing follows, yet the final weights and checkpoint
carry a fault of the last step or two. ``judge_end`` judges the trailing run as it stands: the
update ratio out of band at the last step, for fewer than ``GRAD_RUN`` steps, opens an incident
ready at once -- when it leapt there: out of its band (``band_z``) for fewer than ``GRAD_RUN`` steps
in all. A fault of the last step or two arrives at once; an update ratio that climbs through its
band over many steps is a drift (Adam settling on a new data mixture), which mid-run is confirmed
only by persisting, and at the end nothing can confirm it. The supervisor's own window is exempt, as
mid-run; a grad norm alone (clipped) is no oversized update.
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
    if not 0 < run < GRAD_RUN or trailing_update_run(analyzer.recent, st.band_z) >= GRAD_RUN:
        return []  # nothing out of band at the end, a run mid-run rules judge, or a climb: no leap
    inc = analyzer._new_incident(sig, Trigger("grad", True))
    analyzer.incidents.append(inc)
    analyzer.open = inc
    inc.observe(sig, analyzer._in_band(inc, sig), st)
    inc.ready = True
    return [analyzer._update("opened", inc), analyzer._update("ready", inc)]
