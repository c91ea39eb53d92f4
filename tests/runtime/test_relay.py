"""The node relay (``supervisor/ranks/relay.py``) on a real local Ray: the links of a node reach the
supervisor in fewer calls than they make, every record arrives in order and is acknowledged to its
own link, a malformed batch is refused alone, and a relay killed mid-stream costs a resend, never a
record."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from supervisor.ranks.names import NAMESPACE, supervisor_name

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


def start_stub(job: str, call_s: float) -> Any:
    """A supervisor that answers ``ingest_packed`` as the real one does (one answer per link, its
    records durable at once), taking ``call_s`` per call; it keeps every (link, seq) it got."""
    import ray

    # Defined here: Ray ships it by value (the workers need not import this test module).
    class StubSupervisor:
        def __init__(self) -> None:
            self.got: dict[str, list[int]] = {}
            self.calls = 0

        def ingest_packed(self, wire: Any) -> list[dict[str, Any]]:
            from supervisor.sdk.wire import unpack

            time.sleep(call_s)  # a busy supervisor: batches wait at the relay meanwhile
            self.calls += 1
            out = []
            for _rank, link, _held, seqs, _recs in unpack(wire, as_dicts=True):
                assert link is not None and seqs is not None
                self.got.setdefault(link, []).extend(seqs)
                out.append({"acked": max(self.got[link]), "incarnation": "stub"})
            return out

        def directives(self, rank: int, after_seq: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
            return []

        def seen(self) -> tuple[dict[str, list[int]], int]:
            return self.got, self.calls

    return ray.remote(StubSupervisor).options(name=supervisor_name(job), namespace=NAMESPACE).remote()


@contextlib.contextmanager
def relayed(job: str, n: int, call_s: float) -> Iterator[tuple[list[Any], list[Any]]]:
    """A stub supervisor (``call_s`` per call) and ``n`` links that send through their node's relay;
    at the end the links are closed and every stub in the list (a test may add successors) killed."""
    import ray

    from supervisor.ranks.channel import SupervisorLink

    stubs = [start_stub(job, call_s)]
    links = [
        SupervisorLink(job, r, buffer_records=100_000, poll_interval_s=0.02, relay=True) for r in range(n)
    ]
    try:
        yield stubs, links
    finally:
        for link in links:
            link.close(timeout_s=1.0)
        for stub in stubs:
            ray.kill(stub)


def run_steps(links: list[Any], steps: range, between: Any = None, step_s: float = 0.005) -> None:
    for step in steps:
        for link in links:
            link.sink([{"step": step, "rank": link.rank, "loss": 2.0, "samples": [f"web:a:{step}"]}])
        if between is not None:
            between(step)
        time.sleep(step_s)  # a training step's time


def settle(links: list[Any], produced: int) -> None:
    deadline = time.monotonic() + 60
    while any(link.stats()["acked"] < produced for link in links):
        assert time.monotonic() < deadline, [link.stats() for link in links]
        time.sleep(0.05)


def test_the_links_of_a_node_reach_the_supervisor_in_fewer_calls_each_acked_in_order() -> None:
    import ray

    from supervisor.ranks.relay import relay_name

    job = "relayed"
    with relayed(job, 4, call_s=0.02) as ([stub], links):
        run_steps(links, range(1, 11))
        settle(links, 10)  # the relay is up (the first batches waited for its process to start)
        relay = ray.get_actor(relay_name(job, ray.get_runtime_context().get_node_id()), namespace=NAMESPACE)
        before = ray.get(relay.stats.remote())
        run_steps(links, range(11, 111), step_s=0.02)
        settle(links, 110)
        got, _ = ray.get(stub.seen.remote())
        after = ray.get(relay.stats.remote())
        assert all(link.stats()["relayed"] for link in links)
        assert {link.link_id: got[link.link_id] for link in links} == {
            link.link_id: list(range(1, 111)) for link in links
        }  # every record once, in order, to its own link
        calls, batches = after["calls"] - before["calls"], after["batches"] - before["batches"]
        # Two or more links' batches per call (3-4 here, loaded); one per call if the relay only passed them on.
        assert calls >= 5 and calls <= batches / 2, (calls, batches)
        assert all(link.stats()["unacked"] == 0 and link.dropped == 0 for link in links)


def test_a_malformed_batch_is_refused_alone() -> None:
    import ray

    from supervisor.ranks.relay import node_relay

    job = "relayed-refused"
    with relayed(job, 2, call_s=0.0) as ([stub], links):
        run_steps(links, range(1, 6))
        bad = node_relay(job).ingest_packed.remote({"wire": 99})
        run_steps(links, range(6, 11))
        assert "refused" in ray.get(bad, timeout=30)
        settle(links, 10)
        got, _ = ray.get(stub.seen.remote())
        assert [got[link.link_id] for link in links] == [list(range(1, 11))] * 2


def test_a_relay_killed_mid_stream_costs_a_resend_never_a_record() -> None:
    import ray

    from supervisor.ranks.relay import relay_name

    job = "relayed-killed"
    name = relay_name(job, ray.get_runtime_context().get_node_id())
    killed: list[Any] = []

    def kill_at_40(step: int) -> None:
        if step == 40:
            killed.append(ray.get_actor(name, namespace=NAMESPACE))
            ray.kill(killed[0])

    with relayed(job, 3, call_s=0.01) as ([stub], links):
        run_steps(links, range(1, 81), between=kill_at_40)
        step, deadline = 81, time.monotonic() + 60
        while not all(link.stats()["relayed"] for link in links):  # straight to the supervisor meanwhile
            assert time.monotonic() < deadline, [link.stats() for link in links]
            run_steps(links, range(step, step + 1))
            step += 1
        run_steps(links, range(step, step + 20))  # through a new relay
        settle(links, step + 19)
        got, _ = ray.get(stub.seen.remote())
        for link in links:  # each number at least once, in order of first arrival
            first = list(dict.fromkeys(got[link.link_id]))
            assert first == list(range(1, step + 20)), (link.rank, first)
            assert link.dropped == 0
        assert ray.get_actor(name, namespace=NAMESPACE)._actor_id != killed[0]._actor_id


def test_records_made_while_the_supervisor_is_gone_reach_its_successor_through_the_relay() -> None:
    import ray

    job = "relayed-successor"

    def restart_at_60(step: int) -> None:
        if step == 60:
            deadline = time.monotonic() + 30
            while True:  # its name is free once Ray has it dead
                try:
                    ray.get_actor(supervisor_name(job), namespace=NAMESPACE)
                except ValueError:
                    break
                assert time.monotonic() < deadline, "the killed supervisor's name stayed taken"
                time.sleep(0.05)
            stubs.append(start_stub(job, call_s=0.0))

    with relayed(job, 2, call_s=0.0) as (stubs, links):
        run_steps(links, range(1, 31))
        settle(links, 30)  # all durable at the first supervisor
        ray.kill(stubs[0])
        run_steps(links, range(31, 91), between=restart_at_60)
        settle(links, 90)
        got, _ = ray.get(stubs[1].seen.remote())
        for link in links:  # what the dead one never took, the successor got, in order
            first = list(dict.fromkeys(got[link.link_id]))
            assert first == list(range(31, 91)), (link.rank, first)
            assert link.dropped == 0 and link.stats()["relayed"]
