"""Does the published answer hold on this machine? Reruns a pair's published best configurations, one per prompt
kind, beside plain decoding in one speed job here, and ends with each beside its published figure (holds / differs,
by this job's interval: pipeline/jobs/published.py).

    python -m pipeline.recheck                      # the default pair (make run ends with it)
    python -m pipeline.recheck pair=qwen25_coder_bf16 prompts.per_kind=2   # any other override of the job

The job is an ordinary speed job (campaign ``recheck`` unless one is named, two rounds unless stage.rounds is
given: 8 runs per kind on the default prompts, enough for a 95% interval), so it is skipped when already complete,
logged to MLflow and filed with its provenance. Its arms are data: the published configurations as ``stage.arms``
entries, printed before it starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.config.overrides import hydra_value
from speclab.specs.arms import NONE, PEER_METHODS, Arm
from speclab.specs.tree_shapes import PREFIX as TREE_PREFIX
from store.extend import override_key

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {"campaign": "recheck", "stage.rounds": "2"}


class RecheckError(ValueError):
    """A recheck that cannot run: one line naming the value and what is allowed."""


def entry_of(arm: Arm) -> dict:
    """The ``stage.arms`` entry that runs ``arm`` (the planner's arm as the fixed configuration it chose)."""
    if arm.is_tree:
        return {"tree": arm.drafter.removeprefix(TREE_PREFIX)}
    if arm.method in PEER_METHODS.values():
        return {"method": arm.method, **({"ks": [arm.k]} if arm.k and arm.k_policy == "fixed" else {})}
    entry = {"drafter": arm.drafter, "k_policy": arm.k_policy}
    return {**entry, **({"ks": [arm.k]} if arm.k else {})}


def published_arms(outputs_dir: Path, pair: str) -> tuple[str, list[tuple[str, Arm]]]:
    """The pair's published campaign and, per kind, its best configuration as an arm (read from the campaign's
    own rows, so the arm is exactly the one published)."""
    from analysis.common import read_stage_if_any
    from pipeline.jobs.published import PLAN_SUFFIX, pair_campaign, published_best, read_published

    answer = read_published(outputs_dir)
    if answer is None:
        raise RecheckError(f"no published answer under {outputs_dir}/analysis/answer: run `dvc repro` first")
    campaign = pair_campaign(answer, pair)
    if campaign is None:
        raise RecheckError(f"pair={pair} has no published answer: use one of {sorted(set(answer.best.pair))}")
    speed = read_stage_if_any(outputs_dir, "speed", campaign)
    by_label: dict[str, Arm] = {}
    for row in speed.drop_duplicates(["arm", "k", "k_policy", "drafter"]).itertuples():
        arm = Arm.from_row(row)
        if arm.method != "plain" and arm.drafter != NONE:
            by_label.setdefault(arm.label.removesuffix(PLAN_SUFFIX),
                                Arm("speculative", arm.k, arm.k_policy, arm.drafter) if arm.method == "recommended"
                                else arm)
    out = []
    for best in published_best(answer, pair):
        if best.config not in by_label:
            raise RecheckError(f"published configuration {best.config!r} ({pair}, {best.kind}) is not among "
                               f"campaign {campaign}'s speed rows: rerun `dvc repro`")
        out.append((best.kind, by_label[best.config]))
    return campaign, out


def command(overrides: list[str], entries: list[dict]) -> list[str]:
    given = {override_key(o) for o in overrides}
    extra = [f"{k}={v}" for k, v in DEFAULTS.items() if k not in given]
    arms = "stage.arms=" + hydra_value(entries)
    return [sys.executable, "-m", "pipeline.run", "stage=speed", arms, *extra, *overrides]


def pair_of(overrides: list[str]) -> str:
    """The pair the job runs: the override's, else the config's default (conf/config.yaml)."""
    for o in overrides:
        if o.startswith("pair="):
            return o.split("=", 1)[1]
    import yaml

    defaults = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())["defaults"]
    return next(str(d["pair"]) for d in defaults if isinstance(d, dict) and "pair" in d)


def main(argv: list[str] | None = None) -> int:
    overrides = list(sys.argv[1:] if argv is None else argv)
    if any(o in ("-h", "--help") for o in overrides):
        print(__doc__)
        return 0
    pair = pair_of(overrides)
    try:
        campaign, arms = published_arms(ROOT / "outputs", pair)
    except RecheckError as e:
        print(f"recheck: {e}", file=sys.stderr)
        return 2
    entries = list({repr(e): e for e in (entry_of(a) for _, a in arms)}.values())
    print(f"recheck: the published answer for {pair} (campaign {campaign}) on this machine: "
          + "; ".join(f"{kind}: {a.label}" for kind, a in arms), flush=True)
    cmd = command(overrides, entries)
    print("recheck: " + " ".join(c if "{" not in c else f'"{c}"' for c in cmd[1:]), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
