"""The answer a speed job ends with: per kind, its fastest configuration against plain decoding (the speed-up, its
interval or why there is none, the verdict), the trust state of the job's own checks, and the machine it measured.

The same entries go into the job's record (``speclab_job.json``), from which a sweep's closing table takes its
trust column and its best-per-kind lines (pipeline/jobs/summary.py).
Same concept, other floor: ``speclab/stats/verdict.py``."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from pipeline.jobs.stage_output import ArmResult, StageOutput
from pipeline.config.engine_conf import DEFAULT as DEFAULT_ENGINE
from pipeline.jobs.arms import engine_name
from pipeline.jobs.published import comparison_lines, read_published
from pipeline.jobs.trust import run_trust
from speclab.specs.arms import PLAIN_CHOICE
from speclab.stats.verdict import USE_PLAIN, shows, verdict
from store.records import read_meta

T = TypeVar("T")


@dataclass(frozen=True)
class KindVerdict:
    kind: str
    config: str  # the fastest configuration, in a reader's words
    speedup: float
    lo: float  # NaN: too few runs for an interval
    hi: float
    runs: int
    level: float
    verdict: str  # speculate, unclear, use plain or too few runs (n of N)

    def text(self, where: str = "") -> str:
        """``draft model k=4 x1.34 (95% interval 1.20-1.45, 8 runs)<where>: speculate``."""
        interval = (f"{self.level:.0%} interval {self.lo:.2f}-{self.hi:.2f}" if self.lo == self.lo
                    else "too few runs for an interval")
        meaning = f" ({shows(self.verdict)})" if shows(self.verdict) else ""
        return f"{self.config} x{self.speedup:.2f} ({interval}, {self.runs} runs){where}: {self.verdict}{meaning}"


def fastest_per_kind(items: list[T], kind: Callable[[T], str], speedup: Callable[[T], Any]) -> dict[str, T]:
    """Per kind, in the order kinds first appear, the item with the highest speed-up (the first of a tie)."""
    best: dict[str, T] = {}
    for item in items:
        k = kind(item)
        if k not in best or speedup(item) > speedup(best[k]):
            best[k] = item
    return best


def kind_verdicts(arms: list[ArmResult]) -> list[KindVerdict]:
    """Per kind (every kind pooled only when the job has one), the arm with the highest median speed-up among those
    with an interval (a raced arm that left early has none, and was clearly slower), else among all."""
    timed = [a for a in arms if "speedup" in a.metrics and a.metrics["speedup"] == a.metrics["speedup"]]
    kinds = [a for a in timed if a.params["kind"] != "all"] or timed
    ranked = lambda a: (a.metrics.get("speedup_lo") == a.metrics.get("speedup_lo"), a.metrics["speedup"])  # noqa: E731
    best = fastest_per_kind(kinds, lambda a: str(a.params["kind"]), ranked)
    out = []
    for kind, a in best.items():
        m = a.metrics
        level = float(m["level"])
        # the plan's choice not to speculate, run beside plain, is plain against plain: its ratio is the noise
        said = (USE_PLAIN if (a.label or "").startswith(PLAIN_CHOICE)
                else verdict(m["speedup"], m["speedup_lo"], m["speedup_hi"], m["runs"], level))
        out.append(KindVerdict(kind, a.label or a.name, float(m["speedup"]), float(m["speedup_lo"]),
                               float(m["speedup_hi"]), int(m["runs"]), level, said))
    return out


def verdict_lines(verdicts: list[KindVerdict], trust: str, machine: str) -> list[str]:
    """The job's closing lines: one per kind, then the trust state and the machine."""
    if not verdicts:
        return []
    lines = [f"verdict {v.kind}: {v.text()}" for v in verdicts]
    state = "ok" if trust == "ok" else f"NOT TRUSTED ({trust}: see the warnings above)"
    lines.append(f"trust: {state}; measured on {machine} (speed-ups hold for this machine only)")
    return lines


def as_records(verdicts: list[KindVerdict]) -> list[dict]:
    return [asdict(v) for v in verdicts]


def conclude(runs: Any, cfg: DictConfig, part: str, path: Path, status: str, out: StageOutput | None = None,
             machine: str | None = None) -> list[str]:
    """The stage's entry in the job's record (``runs``: its JobRuns); for a speed result also its closing lines,
    read back from the file when the job found it complete."""
    if out is None and part != "speed":
        runs.record(part, status, path)
        return []
    if out is None:
        out = runs.stage_module(part).summarize(pd.read_parquet(path), cfg)
    trust = (run_trust(out.rows) or ("", ""))[0]
    verdicts = kind_verdicts(out.arms) if part == "speed" else []
    runs.record(part, status, path, out.metrics, trust, verdicts)
    lines = verdict_lines(verdicts, trust, machine or str(read_meta(path).get("machine") or "an unrecorded machine"))
    return lines + (published_lines(cfg, out.arms) if verdicts else [])


def published_lines(cfg: DictConfig, arms: list[ArmResult]) -> list[str]:
    """This job beside the published answer for its pair: greedy runs of speclab's loop only (the published
    answer is of that engine, and sampled runs generate other text)."""
    if engine_name(cfg) != DEFAULT_ENGINE or bool(OmegaConf.select(cfg, "sampling.do_sample")):
        return []
    return comparison_lines(read_published(cfg.outputs_dir), str(cfg.pair.name), arms)
