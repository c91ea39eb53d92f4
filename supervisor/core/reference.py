"""What a healthy run's metric does over an observation window: the reference its ratio check is
judged against.

A metric such as the grad norm is not stationary over a healthy run: it grows as the model leaves
its initialization and sharpens (under Lion, whose update is ``lr * sign(.)``, a small model's rose
from 1.1 at the end of its warm-up to ~14 forty steps later at the same LR) and falls under an LR
decay. The median of every step before the onset then describes the middle of that history, not
the run at the onset, and a window that trains as the healthy run did fails against it. The
reference follows the healthy run instead, over the window's steps:

* a step before the onset (a window after a rollback re-runs them): the healthy run's own value
  at that step;
* a step from the onset on: the metric's *level* at the onset, the median of its last
  ``level_window`` values, as the detector defines a metric's current level.

The reference is the median of those, the statistic the window's own median is compared with.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def healthy_reference(
    before: Iterable[tuple[int, float]], onset: int, window: range, level_window: int
) -> float | None:
    """The median over ``window``'s steps of what the healthy run's metric did at each step.

    ``before``: (step, value) of the healthy steps before ``onset`` with a finite value, oldest
    first (a step may be missing: its value is the level). None when there is no value at all."""
    by_step = {s: v for s, v in before if s < onset}
    if not by_step:
        return None
    level = statistics.median([by_step[s] for s in sorted(by_step)][-max(1, level_window) :])
    per_step = [by_step.get(s, level) if s < onset else level for s in window]
    return statistics.median(per_step) if per_step else level
