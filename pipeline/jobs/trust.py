"""Whether a speed, batch, timing or acceptance job's own conditions let its numbers be trusted, checked as it runs;
a plan carries the verdict of the timing and acceptance parts it priced (``inherited``).

Four checks, each a pure function that returns None (passed) or a ``Failed`` with a one-line reason:
drift (step times before/after the runs differ by more than the analysis's limit), load (the load
average sampled during the job rose above the usable cores, or other processes kept more of the CPU busy between two
samples than the job leaves free: the load average lags a minute, so a short part beside a busy process reads
calm), runs (an arm has fewer runs than an
interval needs) and placement (parameters off the configured device, or the device out of memory:
``speclab.decoding.timing.memory_placement``, recorded in every row's ``memory_trusted``). A value exactly at
its limit passes. The job's verdict is the tag and Parquet column ``trust``: ``ok`` or the failed
checks' names joined by ``,``; ``trust_detail`` joins their reasons with ``; ``. Files written before
these checks read ``unchecked`` (store.compat.LATER_COLUMNS).
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd
import psutil
from omegaconf import DictConfig

from pipeline.tracking.machine import usable_cores

OK, UNCHECKED = "ok", "unchecked"
CHECKED_STAGES = ("speed", "batch", "timing", "acceptance", "load")
# Stages that time nothing themselves but price what earlier parts of the job timed: their rows carry those parts'
# verdict (the plan: its timing and acceptance parts), set by the stage.
INHERITED_STAGES = ("plan",)
PRICED_BY_PLAN = ("timing", "acceptance")
log = logging.getLogger("speclab")


@dataclass(frozen=True)
class Failed:
    name: str  # drift, load, runs or placement
    reason: str  # one line: the value and the limit


def check_drift(ratio: float, max_ratio: float) -> Failed | None:
    """``ratio``: the larger of after/before and before/after step time (speed stage's ``drift_ratio``)."""
    if ratio == ratio and ratio > max_ratio:
        return Failed("drift", f"drift: step times before/after the runs differ by x{ratio:.2f}, "
                               f"above the limit x{max_ratio:g}")
    return None


# Load the machine absorbs beyond the job's own threads before its timings count as disturbed: half a busy thread
# (a monitor, a shell); a second busy process (a whole thread or more) is what slows a timed run.
LOAD_TOLERANCE = 0.5


def free_room(cores: int, own_threads: int) -> float:
    """The other work the machine absorbs beside a job of ``own_threads`` compute threads: the cores they leave
    free, plus ``LOAD_TOLERANCE``."""
    return max(cores - max(int(own_threads), 0), 0) + LOAD_TOLERANCE


def check_load(loads: list[float], cores: int, own_threads: int = 0) -> Failed | None:
    """``loads``: 1-minute load averages sampled during the job, which count the job's own ``own_threads``
    compute threads. Fails when the rest, the other work, exceeds the cores the job leaves free plus
    ``LOAD_TOLERANCE``: a job of two threads on two cores reads about 2.0 on an idle machine and passes."""
    seen = [x for x in loads if x == x]
    if not seen:
        return None
    own = max(int(own_threads), 0)
    other, room = max(seen) - own, free_room(cores, own)
    if other > room:
        return Failed("load", f"load: load average reached {max(seen):.2f} during the job: {other:.2f} beyond its own "
                              f"{own} threads, above the {room:g} that {cores} usable cores leave for other work")
    return None


def check_runs(runs: int, min_runs: int, what: str = "runs per arm") -> Failed | None:
    if runs < min_runs:
        return Failed("runs", f"runs: {runs} {what}, fewer than trust.min_runs = {min_runs}")
    return None


def check_placement(trusted: list[bool], reasons: list[str]) -> Failed | None:
    """``trusted``/``reasons``: the rows' ``memory_trusted`` and ``memory_reason``."""
    bad = [r for t, r in zip(trusted, reasons) if not t]
    if bad:
        return Failed("placement", f"placement: {bad[0]} ({len(bad)} of {len(trusted)} rows)")
    return None


def verdict(failed: list[Failed]) -> tuple[str, str]:
    """The ``trust`` and ``trust_detail`` values of a job with these failed checks."""
    return (",".join(f.name for f in failed) or OK), "; ".join(f.reason for f in failed)


def check_other_cpu(others: list[float], cores: int, own_threads: int = 0) -> Failed | None:
    """``others``: the cores other processes kept busy between consecutive samples (``LoadSampler.others``). Fails
    when the most exceeds what the job leaves free plus ``LOAD_TOLERANCE``, as ``check_load``."""
    seen = [x for x in others if x == x]
    if not seen:
        return None
    room = free_room(cores, own_threads)
    if max(seen) > room:
        return Failed("load", f"load: other processes kept {max(seen):.2f} cores busy during the job, above the "
                              f"{room:g} that {cores} usable cores leave beside its {int(own_threads)} threads")
    return None


class CpuSnapshot(NamedTuple):
    wall_s: float   # time.monotonic()
    busy_s: float   # CPU seconds the whole machine spent busy (/proc/stat)
    own_s: float    # CPU seconds of this process and its children (a server engine's processes are its own)


def cpu_snapshot() -> CpuSnapshot | None:
    """The machine's busy CPU seconds beside this job's own; None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        me = psutil.Process()
        own = sum(me.cpu_times()[:4])  # its threads, and its children that ended and were waited for
        for child in me.children(recursive=True):
            try:
                own += sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
    except (OSError, ValueError, psutil.Error):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle and iowait
    return CpuSnapshot(time.monotonic(), (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK"), own)


MIN_INTERVAL_S = 1.0  # a CPU share over less time is mostly the sampling's own jitter


@dataclass
class LoadSampler:
    """1-minute load averages taken at the job's start, between its blocks or rounds, and at its end; and between
    consecutive samples (at least ``MIN_INTERVAL_S`` apart), the cores that processes other than the job's kept
    busy (``others``), which, unlike the load average, shows a busy process from the first block."""

    samples: list[float] = field(default_factory=list)
    others: list[float] = field(default_factory=list)
    last: CpuSnapshot | None = None

    def sample(self) -> None:
        if hasattr(os, "getloadavg"):
            self.samples.append(float(os.getloadavg()[0]))
        now = cpu_snapshot()
        if now is None:
            return
        if self.last is None:
            self.last = now
        elif now.wall_s - self.last.wall_s >= MIN_INTERVAL_S:
            other = (now.busy_s - self.last.busy_s) - (now.own_s - self.last.own_s)
            self.others.append(max(other, 0.0) / (now.wall_s - self.last.wall_s))
            self.last = now

    def tags(self) -> dict[str, str]:
        """``load_max`` and ``load_median`` over the samples, how many there were, and the most cores other
        processes kept busy between two of them (``other_cpu_max``)."""
        if not self.samples:
            return {}
        return {"load_max": f"{max(self.samples):.2f}", "load_median": f"{statistics.median(self.samples):.2f}",
                "load_samples": str(len(self.samples)),
                **({"other_cpu_max": f"{max(self.others):.2f}"} if self.others else {})}


def job_checks(part: str, rows: pd.DataFrame, metrics: dict[str, float], arm_runs: list[int], cfg: DictConfig,
               loads: list[float], cores: int, own_threads: int = 0, others: list[float] = ()) -> list[Failed]:
    """The failed checks of a finished ``part`` job (speed, batch or timing): ``arm_runs`` the runs of each
    compared arm (speed, batch), ``loads`` the load averages sampled while it ran, ``others`` the cores other
    processes kept busy between those samples and ``own_threads`` its compute threads."""
    t = cfg.trust
    failed = []
    if part in ("speed", "load"):  # batch and timing take no step times before and after their runs
        failed.append(check_drift(float(metrics.get("drift_ratio", float("nan"))), float(t.max_drift)))
    failed.append(check_load(loads, cores, own_threads) or check_other_cpu(list(others), cores, own_threads))
    if part == "timing":  # each time is the median of its repeats
        failed.append(check_runs(int(rows.samples.min()), int(t.min_runs), "repeats per timing"))
    elif arm_runs and part != "acceptance":  # an acceptance run's times calibrate; its count is the prompts'
        failed.append(check_runs(min(arm_runs), int(t.min_runs)))
    if "memory_trusted" in rows:
        failed.append(check_placement(rows.memory_trusted.astype(bool).tolist(),
                                      rows.memory_reason.astype(str).tolist()))
    return [f for f in failed if f is not None]


def warn(part: str, failed: list[Failed]) -> None:
    """One console WARNING per failed check."""
    for f in failed:
        log.warning(f"[{part}] WARNING: untrusted measurement: {f.reason}")


def description_line(trust: str, detail: str) -> str:
    """The run description's line about the job's checks."""
    if trust == OK:
        return "trust: ok (drift, load, runs and placement checks passed)"
    if trust == UNCHECKED:
        return "trust: unchecked (written before the job-time checks)"
    return f"WARNING trust={trust}: {detail}"


def check_job(part: str, out, cfg: DictConfig, load: LoadSampler, own_threads: int = 0) -> dict[str, str]:
    """The checks of a finished ``part`` job (``out``: its StageOutput): each failed one a console WARNING, the
    verdict written on every row (``trust``, ``trust_detail``: JobRuns.finish tags and describes the run from
    them, also for a file logged later); returns the run's late tags (the load over the job)."""
    if part not in CHECKED_STAGES:
        return load.tags()  # a stage of INHERITED_STAGES wrote its parts' verdict on its rows itself
    arm_runs = [int(a.metrics["runs"]) for a in out.arms if "runs" in a.metrics]
    failed = job_checks(part, out.rows, out.metrics, arm_runs, cfg, load.samples, usable_cores(), own_threads,
                        load.others)
    warn(part, failed)
    trust, detail = verdict(failed)
    if failed and bool(cfg.trust.strict) and part in PRICED_BY_PLAN and "plan" in list(cfg.stage.parts):
        raise ValueError(f"trust.strict=true: the plan's {part} part is untrusted ({detail}): nothing written; rerun "
                         "it alone on a quiet machine")
    out.rows["trust"], out.rows["trust_detail"] = trust, detail  # the run's tag and description read them here
    return load.tags()


def run_trust(rows: pd.DataFrame) -> tuple[str, str] | None:
    """A result's verdict as its rows carry it (None for stages without checks)."""
    if "trust" not in rows or not len(rows):
        return None
    return str(rows.trust.iloc[0]), str(rows.trust_detail.iloc[0])


def inherited(parts: dict[str, pd.DataFrame]) -> tuple[str, str]:
    """The verdict of a stage that prices earlier parts' measurements (``parts``: each part's rows): ``ok`` when every
    part is, ``unchecked`` when some was never checked and none failed, else the failed checks' names and, per part,
    its reasons."""
    verdicts = {part: run_trust(rows) or (UNCHECKED, "") for part, rows in parts.items()}
    failed = {part: v for part, v in verdicts.items() if v[0] not in (OK, UNCHECKED)}
    if failed:
        names = dict.fromkeys(n for v in failed.values() for n in v[0].split(","))
        return ",".join(names), "; ".join(f"{part}: {v[1]}" for part, v in failed.items())
    return (UNCHECKED, "") if any(v[0] == UNCHECKED for v in verdicts.values()) else (OK, "")
