"""A closed-loop load: ``concurrency`` clients, each sending its next request as soon as its last one answered, until
``requests`` are sent; the same request indices (prompts) in the same order for every configuration it drives.

The engine's own ``send(index)`` does the request (a server's HTTP call, with its streaming and counters) and
returns what it measured; this module only keeps the load and the clock: when each request started and ended,
on which client, and the load's wall time. A failing request (a dead server) or Ctrl-C stops the load: no client
sends another request, the ones in flight are waited for (each ends on its own timeout), and every answered
request is returned with the reason the load stopped, so nothing measured is lost.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class LoadStopped(RuntimeError):
    """A load that ended before all its requests were answered (a dead server), said in one line."""

    one_line = True


@dataclass(frozen=True)
class Sent:
    """One answered request: its index (the prompt), the client that sent it, its start and end on the load's clock
    (seconds from the load's start) and what ``send`` measured."""
    index: int
    client: int
    started_s: float
    ended_s: float
    measured: Any


@dataclass
class LoadRun:
    concurrency: int
    sent: list[Sent] = field(default_factory=list)
    wall_s: float = 0.0        # the first request's start to the last answer
    stopped: str = ""          # "" when every request was answered; else why the load stopped
    most_in_flight: int = 0    # the most requests in flight at once (at most ``concurrency``)


def closed_loop(send: Callable[[int], Any], requests: int, concurrency: int) -> LoadRun:
    """Send ``requests`` requests (indices 0..requests-1, in order) from ``concurrency`` clients."""
    if concurrency < 1 or requests < 1:
        raise ValueError(f"concurrency {concurrency} and requests {requests} are not allowed: need both at least 1")
    run = LoadRun(concurrency)
    lock, stop = threading.Lock(), threading.Event()
    state = {"next": 0, "in_flight": 0, "clients": concurrency}
    # Waited for on a count of our own, not Thread.join: a Ctrl-C that interrupts a join can leave the joined thread
    # marked as ended while it still runs (bpo-45274), and its answer would be lost.
    done = threading.Condition(lock)
    began = time.perf_counter()

    def client(me: int) -> None:
        try:
            while not stop.is_set():
                with lock:
                    if state["next"] >= requests:
                        return
                    index, state["next"] = state["next"], state["next"] + 1
                    state["in_flight"] += 1
                    run.most_in_flight = max(run.most_in_flight, state["in_flight"])
                start = time.perf_counter() - began
                try:
                    measured = send(index)
                except Exception as exc:  # a dead server: no client sends again; what was answered stays
                    with lock:
                        state["in_flight"] -= 1
                        run.stopped = run.stopped or f"request {index} failed: {type(exc).__name__}: {exc}"
                    stop.set()
                    return
                end = time.perf_counter() - began
                with lock:
                    state["in_flight"] -= 1
                    run.sent.append(Sent(index, me, start, end, measured))
        finally:
            with done:
                state["clients"] -= 1
                done.notify_all()

    for i in range(concurrency):
        threading.Thread(target=client, args=(i,), daemon=True).start()

    def wait_all() -> None:
        with done:
            while state["clients"]:
                done.wait(0.1)

    try:
        wait_all()
    except KeyboardInterrupt:  # stop sending; the requests in flight end on their own timeouts
        stop.set()
        with lock:
            run.stopped = run.stopped or "interrupted (Ctrl-C): no request sent after it"
        wait_all()
    run.sent.sort(key=lambda s: s.index)
    if run.sent:
        run.wall_s = max(s.ended_s for s in run.sent) - min(s.started_s for s in run.sent)
    return run


def summary(run: LoadRun, tokens: Callable[[Any], int]) -> dict[str, float]:
    """A load's headline numbers: output tokens/s over all answered requests (``tokens`` reads a request's output
    tokens from what ``send`` measured; their sum over the load's wall time), the median and 90th percentile of the
    requests' end-to-end latency, and how many were answered. NaN where none was."""
    if not run.sent or run.wall_s <= 0:
        return {"requests": float(len(run.sent)), "tokens_per_s": float("nan"), "latency_median_s": float("nan"),
                "latency_p90_s": float("nan")}
    latency = np.array([s.ended_s - s.started_s for s in run.sent])
    return {"requests": float(len(run.sent)),
            "tokens_per_s": float(sum(tokens(s.measured) for s in run.sent) / run.wall_s),
            "latency_median_s": float(np.median(latency)), "latency_p90_s": float(np.quantile(latency, 0.9))}
