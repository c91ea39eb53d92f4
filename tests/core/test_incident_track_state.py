"""An incident's detector state is written with every state write while it is open: its
``state_dict`` is built without ``dataclasses.asdict``'s deep copies (~40 ms for a 200-step
trajectory, 2 writes a second), and must still be exactly what ``asdict`` gives, and load back."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

from supervisor.core.diagnose import Facts, IncidentTrack, Point
from supervisor.core.model import FirstAnomaly


def _track() -> IncidentTrack:
    facts = Facts(
        trigger="grad_norm",
        baseline_loss=2.5,
        update_spike=(41, 3.5),
        lr_jump=(40, 10.0),
        lr_back=(60, 9.5, 10.0, None),
        nonfinite_ranks=[3, 5],
        occurrences=[40, 90],
        resume_missing=["optimizer"],
        checksum=("c0ffee", [2, 7]),  # type: ignore[arg-type]
    )
    track = IncidentTrack(
        key=4, onset_step=40, detected_step=42, first_anomaly=FirstAnomaly(40, "grad_norm", 3, 9.0, 1.0, 12.5),
        baseline_log=math.log(2.5), facts=facts, suspect_samples=["web/17", "code/3"], first_rank=3,
        rank_local=True, period=None, last_phenotype="divergence",
    )  # fmt: skip
    for i in range(200):
        track.trajectory.append(
            Point(
                40 + i,
                0.1 * i,
                2.5 + i,
                i % 3 == 0,
                i == 7,
                1.0 + i,
                None if i % 2 else 0.5,
                True,
                i == 9,
                1e-3,
            )
        )
    return track


def test_state_dict_is_what_asdict_gives() -> None:
    track = _track()
    expected = asdict(track)
    got = track.state_dict()
    assert got == expected
    assert json.dumps(got) == json.dumps(expected)  # tuples stay tuples, as the state file saw them
    assert type(got["facts"]["update_spike"]) is tuple and type(got["trajectory"][0]) is dict


def test_state_dict_shares_no_mutable_part_with_the_track() -> None:
    track = _track()
    state = track.state_dict()
    track.trajectory.append(Point(999, 0.0, 1.0, True, False))
    track.suspect_samples.append("books/1")
    track.facts.occurrences.append(120)
    assert len(state["trajectory"]) == 200 and state["suspect_samples"] == ["web/17", "code/3"]
    assert state["facts"]["occurrences"] == [40, 90]


def test_state_dict_loads_back() -> None:
    track = _track()
    assert IncidentTrack.from_state(json.loads(json.dumps(track.state_dict()))) == track
