"""The restart policy as a pure decision: restart (with backoff) or escalate, with the setting named."""

from __future__ import annotations

from supervisor.core.policy import load_policy
from supervisor.core.policy.settings import Restarts
from supervisor.runtime.restarts import GroupEvent, decide

LOST = GroupEvent("lost", (1,), "worker actor died")


def test_restart_then_escalate_at_the_limit_naming_the_setting() -> None:
    s = Restarts(max_restarts=2, backoff_s=1.0, backoff_factor=3.0, backoff_max_s=5.0)
    first = decide(LOST, [], 100, s)
    second = decide(LOST, [100], 150, s)
    third = decide(LOST, [100, 150], 200, s)
    assert (first.action, first.delay_s) == ("restart", 1.0)
    assert (second.action, second.delay_s) == ("restart", 3.0)
    assert third.action == "escalate" and "restarts.max_restarts=2" in third.reason
    assert "rank(s) [1] lost" in third.reason


def test_old_restarts_stop_counting_outside_the_window_and_backoff_is_capped() -> None:
    s = Restarts(max_restarts=1, window_steps=100, backoff_s=10.0, backoff_factor=10.0, backoff_max_s=30.0)
    assert decide(LOST, [50], 120, s).action == "escalate"
    later = decide(LOST, [50], 400, s)
    assert later.action == "restart" and "window_steps=100" in later.reason
    assert Restarts(backoff_s=10.0, backoff_factor=10.0, backoff_max_s=30.0).backoff(3) == 30.0


def test_settings_come_from_the_policy_yaml() -> None:
    s = load_policy("default").restarts
    assert s.max_restarts >= 1 and s.backoff_max_s >= s.backoff_s


def test_a_failure_that_repeats_before_any_step_escalates_and_progress_resets_it() -> None:
    s = Restarts(max_restarts=5, max_without_progress=2)
    assert decide(LOST, [0], 0, s, without_progress=1).action == "restart"
    stuck = decide(LOST, [0, 0], 0, s, without_progress=2)
    assert stuck.action == "escalate" and "restarts.max_without_progress=2" in stuck.reason
    assert decide(LOST, [0, 0], 40, s, without_progress=0).action == "restart"  # it trained: a new fault


def test_a_failed_process_is_named_by_the_last_error_line_of_its_output() -> None:
    from supervisor.ranks.process import last_error_line

    out = (
        'step 10 loss 2.1\nTraceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
        "    raise ValueError('x')\nValueError: boom\n"
        "[rank1]: Traceback (most recent call last):\n"
        "[rank1]: supervisor.errors.ConfigError: faults: drill faults ['garbage_batch'] need the loader\n"
    )
    assert (
        last_error_line(out)
        == "supervisor.errors.ConfigError: faults: drill faults ['garbage_batch'] need the loader"
    )
    assert last_error_line("step 1 loss 2.0\nno errors here\n") is None
    assert last_error_line("KeyboardInterrupt\n") == "KeyboardInterrupt"
    assert len(last_error_line("RuntimeError: " + "x" * 5000) or "") == 300
