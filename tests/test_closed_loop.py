"""The closed-loop load (pipeline/engines/closed_loop.py) on a fake engine whose requests take a known time."""
import threading
import time

import pytest

from pipeline.engines.closed_loop import closed_loop


def _sleeper(seconds: float, fail_at: int | None = None):
    live, most = [0], [0]
    lock = threading.Lock()

    def send(index: int) -> dict:
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        try:
            if index == fail_at:
                raise ConnectionError("server closed the connection")
            time.sleep(seconds)
            return {"tokens": index}
        finally:
            with lock:
                live[0] -= 1

    return send, most


def test_each_client_sends_its_next_request_when_its_last_one_answers():
    send, most = _sleeper(0.05)
    run = closed_loop(send, requests=8, concurrency=4)
    assert [s.index for s in run.sent] == list(range(8)) and run.stopped == ""
    assert most[0] == run.most_in_flight == 4
    assert run.wall_s == pytest.approx(0.10, abs=0.04)  # two waves of four
    assert {s.measured["tokens"] for s in run.sent} == set(range(8))
    one = closed_loop(send, requests=4, concurrency=1)
    assert one.most_in_flight == 1 and one.wall_s == pytest.approx(0.20, abs=0.05)
    starts = [s.started_s for s in one.sent]
    assert starts == sorted(starts) and all(b.started_s >= a.ended_s for a, b in zip(one.sent, one.sent[1:]))


def test_a_dead_server_stops_the_load_and_keeps_what_was_answered():
    send, _ = _sleeper(0.05, fail_at=5)
    run = closed_loop(send, requests=20, concurrency=2)
    assert run.stopped == "request 5 failed: ConnectionError: server closed the connection"
    got = [s.index for s in run.sent]
    assert set(range(5)) <= set(got) and 5 not in got and len(got) <= 6  # the other client's request in flight


def test_bad_load_is_one_line():
    with pytest.raises(ValueError, match="concurrency 0 and requests 3 are not allowed"):
        closed_loop(lambda i: i, requests=3, concurrency=0)


def test_ctrl_c_stops_sending_waits_for_the_requests_in_flight_and_keeps_them():
    import _thread

    send, _ = _sleeper(0.1)
    threading.Timer(0.15, _thread.interrupt_main).start()  # Ctrl-C during the second wave
    run = closed_loop(send, requests=40, concurrency=2)
    assert run.stopped == "interrupted (Ctrl-C): no request sent after it"
    got = [s.index for s in run.sent]
    assert got == list(range(len(got))) and 4 <= len(got) <= 8  # the first waves, and the ones in flight finished
    assert all(s.ended_s - s.started_s >= 0.09 for s in run.sent)


def test_the_summary_is_output_tokens_over_the_loads_wall_time_and_latency_quantiles():
    from pipeline.engines.closed_loop import LoadRun, Sent, summary

    run = LoadRun(2, [Sent(0, 0, 0.0, 1.0, {"n": 10}), Sent(1, 1, 0.0, 2.0, {"n": 20}), Sent(2, 0, 1.0, 4.0, {"n": 30})],
                  wall_s=4.0)
    got = summary(run, lambda m: m["n"])
    assert got == {"requests": 3.0, "tokens_per_s": 15.0, "latency_median_s": 2.0,
                   "latency_p90_s": pytest.approx(2.8)}
    assert summary(LoadRun(2), lambda m: m["n"])["tokens_per_s"] != summary(LoadRun(2), lambda m: m["n"])["tokens_per_s"]
