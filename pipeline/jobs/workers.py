"""A multirun's local workers (joblib's loky processes) die with the multirun's process.

Loky never checks its parent: after the parent is killed (SIGKILL, out of memory) a worker goes on
with a job nobody collects, then sits idle for minutes holding its models' memory. A job run in such a
worker asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) for a SIGTERM when the parent dies; the
SIGTERM ends the job like Ctrl-C (its runs KILLED) and the worker exits. The request outlives the job,
so an idle worker dies with its parent too (SIGTERM's default action between jobs). The same handler
takes the SIGTERM a stopping multirun sends its busy workers (pipeline/jobs/pool.py).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.jobs.errors import Interrupted
from pipeline.tracking.mlflow_runs import SWEEP_PID_ENV

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def sweep_parent() -> int | None:
    """The multirun's pid when this process is its local worker (not the multirun itself, not a SLURM
    job on another machine or under another parent)."""
    pid, _, host = os.environ.get(SWEEP_PID_ENV, "").partition(" ")
    if not pid.isdigit() or host != platform.node() or int(pid) in (os.getpid(), 1) or os.getppid() != int(pid):
        return None
    return int(pid)


def signal_at_parent_death(signum: int) -> bool:
    """Ask the kernel for ``signum`` when this process's parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def _interrupt(signum, frame) -> None:
    # The job ends its runs KILLED on the way out: a second signal must not cut that short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gone = sweep_parent() is None  # the parent that set this handler is no longer this process's parent
    raise Interrupted(signum, "the multirun's process is gone" if gone else "the multirun is stopping")


@contextmanager
def dies_with_sweep() -> Iterator[None]:
    """Around a job: in a multirun's local worker, the parent's death ends the job (runs KILLED) and the worker."""
    parent = sweep_parent()
    if parent is None or not signal_at_parent_death(signal.SIGTERM):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if os.getppid() != parent:  # died before the request was made
            raise KeyboardInterrupt("the multirun's process is gone")
        yield
    except KeyboardInterrupt:
        if os.getppid() != parent:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signal.SIGTERM)  # nobody collects this job's result or waits for this worker
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
