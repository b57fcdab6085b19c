"""Does the published answer hold on this machine? Reruns a pair's published best configurations, one per prompt
kind, beside plain decoding in one speed job here, and ends with each beside its published figure (holds / differs,
by this job's interval: pipeline/jobs/published.py). The main job (`make run`) runs the same configurations in its
own blocks (a ``published`` arm entry, conf/stage/quick.yaml); this command runs them alone, on any pair.

    python -m pipeline.recheck                      # the default pair
    python -m pipeline.recheck pair=qwen25_coder_bf16 prompts.per_kind=2   # any other override of the job

The job is an ordinary speed job (campaign ``recheck`` unless one is named; the speed stage's design: raced, within
a budget of stage.rounds rounds, at least the 6 runs a kind a 95% interval needs), so it is skipped when already complete,
logged to MLflow and filed with its provenance. Its arms are data: the published configurations as ``stage.arms``
entries, printed before it starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.config.overrides import hydra_value
from store.published_answer import PublishedError as RecheckError, entry_of, published_arms
from store.extend import override_key

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {"campaign": "recheck"}


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
