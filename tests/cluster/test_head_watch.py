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


def test_a_closed_gcs_is_raised_in_the_driver_and_nothing_forces_the_end() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    forced: list[str] = []
    watch = ClusterWatch(
        address, "run the same command with resume=true out=OUT", every_s=0.02, grace_s=0.3, on_timeout=forced.append
    ).start()
    time.sleep(0.2)
    watch.check()  # the head answers: nothing to raise
    server.close()
    wait_for(lambda: watch.lost is not None, 5, "the watch to find the head lost", poll_s=0.01)
    with pytest.raises(ClusterLost) as raised:
        watch.check()
    assert str(raised.value) == (
        f"lost the Ray cluster: its head (GCS at {address}) refused 3 connections over 0.06 s; nothing recorded is lost"
    )
    assert raised.value.hint == "run the same command with resume=true out=OUT"
    watch.stop()  # the driver shut its Ray down in time
    time.sleep(0.5)
    assert forced == []


def test_a_driver_that_does_not_stop_in_time_is_ended_with_the_error_line() -> None:
    ended = threading.Event()
    lines: list[str] = []

    def end(line: str) -> None:
        lines.append(line)
        ended.set()

    hint = "start the cluster again, then run the same command with resume=true out=OUT"
    ClusterWatch("127.0.0.1:9", hint, every_s=0.02, grace_s=0.1, probe=lambda address: False, on_timeout=end).start()
    assert ended.wait(5)
    assert lines == [
        "error: lost the Ray cluster: its head (GCS at 127.0.0.1:9) refused 3 connections over 0.06 s; nothing "
        "recorded is lost; to continue, start the cluster again, then run the same command with resume=true out=OUT"
    ]


def test_a_stopped_watch_probes_no_more() -> None:
    probed: list[str] = []
    watch = ClusterWatch("127.0.0.1:9", "", every_s=0.02, probe=lambda address: probed.append(address) or True).start()
    wait_for(lambda: len(probed) >= 2, 5, "two probes", poll_s=0.01)
    watch.stop()
    time.sleep(0.1)
    count = len(probed)
    time.sleep(0.2)
    assert len(probed) == count and watch.lost is None
