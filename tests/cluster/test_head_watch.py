"""ClusterWatch on its own: the rule, a real listening socket as the GCS, and the two ways a lost head ends the driver
(raised in the driver's thread, or the process ended after the grace period). The real cluster case is
`test_reliability_servers.py::test_a_search_that_loses_the_clusters_head_stops_with_the_resume_line_and_resumes`."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from reliability_helpers import wait_for

from tune_dfrl.cluster.head_watch import ClusterLost, ClusterWatch, gcs_answers, head_lost


@pytest.mark.parametrize(
    ("probes", "lost"),
    [
        ([], False),
        ([False, False], False),
        ([False, False, False], True),
        ([True, False, False, False], True),
        ([False, False, True, False, False], False),
        ([False, True, False, False, False], True),
    ],
)
def test_the_head_is_lost_after_three_refusals_in_a_row(probes: list[bool], lost: bool) -> None:
    assert head_lost(probes, misses=3) is lost


def test_a_listening_port_answers_and_a_closed_one_does_not() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert gcs_answers(address)
    assert not gcs_answers(address)


# How long a test waits for the watch's thread to do what it must: far longer than it takes even on a loaded machine
# (the waits end as soon as it is done). The watch probes every 0.02 s.
DEADLINE_S = 60.0


def test_a_closed_gcs_is_raised_in_the_driver_and_nothing_forces_the_end() -> None:
    """The driver stops the watch within its grace period (60 s here, so that a slow machine cannot make it late):
    the watch's thread ends without forcing the end."""
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    forced: list[str] = []
    probed: list[bool] = []

    def probe(address: str) -> bool:
        probed.append(gcs_answers(address))
        return probed[-1]

    watch = ClusterWatch(
        address,
        "run the same command with resume=true out=OUT",
        every_s=0.02,
        grace_s=DEADLINE_S,
        probe=probe,
        on_timeout=forced.append,
    ).start()
    wait_for(lambda: len(probed) >= 3, DEADLINE_S, "three probes of the listening head", poll_s=0.01)
    watch.check()  # the head answers: nothing to raise
    assert all(probed[:3]) and watch.lost is None
    server.close()
    wait_for(lambda: watch.lost is not None, DEADLINE_S, "the watch to find the head lost", poll_s=0.01)
    with pytest.raises(ClusterLost) as raised:
        watch.check()
    assert str(raised.value) == (
        f"lost the Ray cluster: its head (GCS at {address}) refused 3 connections over 0.06 s; nothing recorded is lost"
    )
    assert raised.value.hint == "run the same command with resume=true out=OUT"
    watch.stop()  # the driver shut its Ray down in time
    watch._thread.join(DEADLINE_S)
    assert not watch._thread.is_alive() and forced == []


def test_a_driver_that_does_not_stop_in_time_is_ended_with_the_error_line() -> None:
    ended = threading.Event()
    lines: list[str] = []

    def end(line: str) -> None:
        lines.append(line)
        ended.set()

    hint = "start the cluster again, then run the same command with resume=true out=OUT"
    ClusterWatch("127.0.0.1:9", hint, every_s=0.02, grace_s=0.1, probe=lambda address: False, on_timeout=end).start()
    assert ended.wait(DEADLINE_S)
    assert lines == [
        "error: lost the Ray cluster: its head (GCS at 127.0.0.1:9) refused 3 connections over 0.06 s; nothing "
        "recorded is lost; to continue, start the cluster again, then run the same command with resume=true out=OUT"
    ]


def test_a_stopped_watch_probes_no_more() -> None:
    probed: list[str] = []
    watch = ClusterWatch("127.0.0.1:9", "", every_s=0.02, probe=lambda address: probed.append(address) or True).start()
    wait_for(lambda: len(probed) >= 2, DEADLINE_S, "two probes", poll_s=0.01)
    watch.stop()
    watch._thread.join(DEADLINE_S)  # a probe under way when it was stopped may still finish
    count = len(probed)
    assert not watch._thread.is_alive()
    time.sleep(0.2)
    assert len(probed) == count and watch.lost is None
