"""My workload, my answer: from a JSONL file of your prompts (Spec-Bench's schema: question_id, category, turns),
the planner's recommendation per category, then its check in adjacent runs on the prompts the plan did not use, and
one closing block with the answer, its interval and what it cost.

    python -m pipeline.workload my.jsonl                          # the default pair
    python -m pipeline.workload my.jsonl pair=qwen25_coder_bf16   # any override of both jobs

Two ordinary jobs in the campaign ``workload-<file name>`` (or ``campaign=...``): a plan on the first
``PLAN_PER_KIND`` prompts of each category, its sample grown until each category is settled (up to ``plan_cap``
prompts: ``stage.sample_max_prompts``, leaving the smallest category one prompt to check), then a speed job on the
prompts after the largest sample (at most ``CHECK_PER_KIND``), plain beside the recommended configuration, in enough
rounds for a 95% interval per category. Both are skipped when already complete; a category needs
``PLAN_PER_KIND`` + 1 prompts."""
from __future__ import annotations

import math
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from speclab.stats.intervals import median_ci, runs_needed
from speclab.specs.arms import PLAIN_CHOICE, Arm
from speclab.stats.verdict import USE_PLAIN, verdict

ROOT = Path(__file__).resolve().parents[1]
PLAN_PER_KIND = 2     # the planner's sample per category (as +sweep=plan)
CHECK_PER_KIND = 6    # held-out prompts per category the check runs at most


class WorkloadError(ValueError):
    """A workload that cannot be planned and checked: one line naming the value and what is allowed."""


@dataclass(frozen=True)
class Workload:
    file: Path
    kinds: dict[str, int]  # category -> prompts in the file, in file order

    @property
    def campaign(self) -> str:
        stem = "".join(c if c.isalnum() or c in "_.-" else "-" for c in self.file.stem)[:48].strip("-.") or "file"
        return f"workload-{stem}"

    @property
    def plan_cap(self) -> int:
        """The most prompts a category's plan sample may grow to: ``stage.sample_max_prompts``'s default, leaving at
        least one prompt of the smallest category for the check."""
        from pipeline.config.schema import PlanStage

        return max(PLAN_PER_KIND, min(PlanStage.sample_max_prompts, min(self.kinds.values()) - 1))

    def check_rounds(self, skip: int, level: float = 0.95) -> int:
        """Rounds over the held-out prompts (those after the first ``skip`` of each category) that give every
        category the runs an interval needs."""
        held_out = min(min(n - skip, CHECK_PER_KIND) for n in self.kinds.values())
        return max(1, math.ceil(runs_needed(level) / held_out))


def read_workload(path: str) -> Workload:
    from pipeline.prompts.prompt_files import parse_jsonl

    file = Path(path).expanduser().resolve()
    if file.suffix != ".jsonl" or not file.is_file():
        raise WorkloadError(f"workload file {path!r} is not a readable .jsonl file: give the path of a JSONL file "
                            "with question_id, category and turns on each line")
    kinds = dict(Counter(p.kind for p in parse_jsonl(file)))
    small = {k: n for k, n in kinds.items() if n <= PLAN_PER_KIND}
    if small:
        raise WorkloadError(f"categories {small} of {path!r} have too few prompts: each needs at least "
                            f"{PLAN_PER_KIND + 1} ({PLAN_PER_KIND} for the plan, the rest for its check)")
    return Workload(file, kinds)


def common_overrides(w: Workload, overrides: list[str]) -> list[str]:
    given = {o.split("=", 1)[0] for o in overrides}
    return [f"prompts.file={w.file}", "prompts.kinds=[" + ",".join(f"'{k}'" for k in w.kinds) + "]",
            *([f"campaign={w.campaign}"] if "campaign" not in given else [])]


def plan_command(w: Workload, overrides: list[str]) -> list[str]:
    """The plan: the first ``PLAN_PER_KIND`` prompts of each category, grown a category at a time until settled
    (stage.sample_precision) up to ``plan_cap`` prompts."""
    return [sys.executable, "-m", "pipeline.run", "stage=plan", *common_overrides(w, overrides),
            f"prompts.per_kind={PLAN_PER_KIND}", f"stage.sample_max_prompts={w.plan_cap}", *overrides]


def check_command(w: Workload, overrides: list[str], skip: int) -> list[str]:
    """The check on the prompts after the first ``skip`` of each category (the largest sample the plan grew to: no
    category's check holds a prompt its plan saw), plain beside the recommendation."""
    given = {o.split("=", 1)[0] for o in overrides}
    return [sys.executable, "-m", "pipeline.run", "stage=speed", *common_overrides(w, overrides),
            f"prompts.skip_per_kind={skip}", f"prompts.per_kind={CHECK_PER_KIND}", "stage.arms=[{method:recommended}]",
            *([f"stage.rounds={w.check_rounds(skip)}"] if "stage.rounds" not in given else []), *overrides]


def plan_sample(plan: pd.DataFrame) -> int:
    """The largest sample of a category in the plan's rows (its prompts)."""
    rec = plan[plan.recommended & (plan.kind != "all")]
    return int(rec.prompts.max()) if len(rec) else PLAN_PER_KIND


def answer_lines(plan: pd.DataFrame, speed: pd.DataFrame, minutes: float) -> list[str]:
    """Per category: the plan's choice and prediction, the check's median speed-up over the adjacent plain run with
    its 95% interval, and the verdict; then what it cost."""
    lines = []
    rec = plan[plan.recommended & (plan.kind != "all")]
    runs = speed[speed.arm == "recommended"]
    for r in rec.itertuples():
        choice = Arm("speculative", int(r.k) or None, str(r.k_policy), str(r.drafter)).label
        predicted = (f"predicted x{r.predicted:.2f}" + (f" ({r.level:.0%} {r.predicted_lo:.2f}-{r.predicted_hi:.2f})"
                                                        if r.predicted_lo == r.predicted_lo else ""))
        x = runs[runs.kind == r.kind].ratio_to_adjacent_plain.to_numpy(dtype=float)
        if not len(x):
            lines.append(f"{r.kind}: {choice}, {predicted}; not checked")
            continue
        lo, hi = median_ci(x)
        med = float(np.median(x))
        interval = f"95% interval {lo:.2f}-{hi:.2f}" if lo == lo else "too few runs for an interval"
        said = verdict(med, lo, hi, len(x))
        if choice == PLAIN_CHOICE:  # plain beside plain: the ratio is the measurement's noise, not a gain
            said = f"{USE_PLAIN} (plain beside plain: the noise of this machine)"
        lines.append(f"{r.kind}: {choice}, {predicted}; measured on held-out prompts x{med:.2f} ({interval}, "
                     f"{len(x)} runs): {said}")
    lines.append(f"cost: {minutes:.1f} min here (plan and check), {speed.wall_s.sum() / 60:.1f} min of timed runs")
    return lines


def latest(outputs: Path, campaign: str, stage: str, pair: str) -> pd.DataFrame:
    files = sorted((outputs / "campaigns" / campaign / stage).glob(f"{pair}-*.parquet"), key=lambda p: p.stat().st_mtime)
    return pd.read_parquet(files[-1]) if files else pd.DataFrame()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    try:
        w = read_workload(args[0])
    except (WorkloadError, ValueError) as e:
        print(f"workload: {e}", file=sys.stderr)
        return 2
    overrides = args[1:]
    from pipeline.recheck import pair_of

    campaign = next((o.split("=", 1)[1] for o in overrides if o.startswith("campaign=")), w.campaign)
    print(f"workload: {w.file.name}, categories {w.kinds}; campaign {campaign}", flush=True)
    start = time.monotonic()
    pair = pair_of(overrides)
    outputs = ROOT / "outputs"
    for step in (lambda: plan_command(w, overrides),
                 lambda: check_command(w, overrides, plan_sample(latest(outputs, campaign, "plan", pair)))):
        cmd = step()
        print("workload: " + " ".join(cmd[1:]), flush=True)
        code = subprocess.run(cmd, cwd=ROOT).returncode
        if code:
            return code
    lines = answer_lines(latest(outputs, campaign, "plan", pair), latest(outputs, campaign, "speed", pair),
                         (time.monotonic() - start) / 60)
    print(f"\nyour workload {w.file.name} on {pair} (campaign {campaign}):\n" + "\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
