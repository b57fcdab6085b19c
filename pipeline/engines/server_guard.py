"""Runs a server as its child and stops the server's whole process group when told to stop: ``python
server_guard.py ARGV...``. Run as a plain script (no package import: it starts in milliseconds).

A server that spawns workers (vLLM: an engine-core process and a worker) cannot be trusted to stop them when it is
itself stopped abruptly: after its job was SIGKILLed, vLLM's API server stopped and its worker ran on. The guard leads
the process group the server and its workers share (pipeline/engines/local_server.py starts it that way, with the
kernel's SIGTERM on the job's death); on SIGTERM or SIGINT it sends the group SIGTERM, waits ``GRACE_S`` for the
server to stop its workers, then SIGKILLs whatever of the group is left. It exits as the server did.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 15.0


def _sweep(child: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the group (this guard ignores it), wait for the server, SIGKILL the rest of the group but this guard."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.killpg(0, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    me = os.getpid()
    for pid in _group_members(os.getpgrp()):
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    child.poll()


def _group_members(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def main(argv: list[str]) -> int:
    child = subprocess.Popen(argv)

    def stop(signum, frame) -> None:
        _sweep(child, GRACE_S)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = child.wait()
    _sweep(child, 2.0)  # the server ended by itself: workers it left behind go with it
    if code < 0:  # ended by a signal: end the same way, so the caller reads the same cause
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
