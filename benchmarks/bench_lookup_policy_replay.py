"""Prompt lookup's k policies replayed on plain greedy output, priced by a plan's time model.

Greedy speculative output equals plain greedy, so for a drafter without a model (prompt lookup) every
iteration's proposal, its accepted count and the policy's next choice follow from the plain greedy
continuation alone: the loop's decisions are replayed without timing anything. The policies are built
as the pipeline builds them (``pipeline.config.strategy_config.policy_spec``, one ``k_policy`` override each), with
the price table and the time model of a committed plan job (its timing and acceptance files), so a
change to a policy can be weighed in a minute instead of a 20-minute speed job. Writes one row per
(prompt, policy) to outputs/benchmarks/lookup_policy_replay.parquet and prints the iterations and the
predicted speed-up of each policy as a ratio to fixed k=2, per prompt and as a median over prompts.

    python -m benchmarks.bench_lookup_policy_replay --campaign timemodel2 --job 59fe40cc915e22d6
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from benchmarks.common import add_pair_arguments, greedy_continuations  # noqa: E402
from pipeline.config.schema import register  # noqa: E402
from store.records import write_parquet  # noqa: E402
from speclab.costs.planning import calibrate  # noqa: E402
from pipeline.config.strategy_config import policy_spec  # noqa: E402
from speclab.decoding.drafters import PromptLookupDrafter  # noqa: E402
from speclab.decoding.k_policy import FixedK, KPolicy  # noqa: E402
from speclab.drafting.strategy import Prices  # noqa: E402
from speclab.costs.time_model import CostTable, Trace  # noqa: E402

CONF = str(Path(__file__).resolve().parents[1] / "conf")
# name -> k_policy overrides (None: fixed k=2, the baseline of the ratios)
POLICIES = {"fixed k=2": None, "cost_model free_k_min=1": [], "cost_model free_k_min=null": ["k_policy.free_k_min=null"]}
SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("kind", pa.string()), ("policy", pa.string()), ("iterations", pa.int32()),
    ("plain_steps_with_match", pa.int32()), ("tokens", pa.int32()), ("mean_k", pa.float64()),
    ("predicted_speedup", pa.float64()), ("iterations_ratio_to_k2", pa.float64()),
    ("speedup_ratio_to_k2", pa.float64()), ("job", pa.string()),
])


def replay(prompt: list[int], new: list[int], policy: KPolicy) -> tuple[Trace, int]:
    """The loop's iterations on this continuation: (its trace, plain steps taken where a match existed)."""
    seq, drafter, n0 = torch.tensor([prompt + new]), PromptLookupDrafter(), len(prompt)
    length, proposed, made, lengths, skipped = n0, [], [], [], 0
    policy.start()
    while length - n0 < len(new):
        label = drafter.label(seq, length)
        if hasattr(policy, "condition"):
            policy.condition(label)
        k = min(policy.k, len(new) - (length - n0) - 1)  # the loop's last token is the target's own
        skipped += int(k == 0 and label != 0)
        p = drafter.propose(seq, length, k, None, None)[0] if k else seq.new_empty(0)
        drafter.rollback(length)
        truth = seq[0, length: length + len(p)]
        accepted = int(torch.cumprod((p == truth).int(), 0).sum()) if len(p) else 0
        policy.update(len(p), accepted)
        proposed.append(len(p)), lengths.append(length), made.append(accepted + 1)
        length += accepted + 1
    zeros = np.zeros(len(proposed), int)
    return Trace(n0, np.array(proposed), np.array(made), np.array(lengths), zeros, zeros, False, True), skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(ap)
    ap.add_argument("--campaign", default="timemodel2")
    ap.add_argument("--job", default="59fe40cc915e22d6", help="the plan job whose timing and acceptance price it")
    ap.add_argument("--outputs-dir", default="outputs")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts", default="default.yaml", help="a file in pipeline/prompts/ or a path")
    ap.add_argument("--out", default="outputs/benchmarks/lookup_policy_replay.parquet")
    args = ap.parse_args()
    from speclab.models.loading import load_pair

    base = Path(args.outputs_dir) / "campaigns" / args.campaign
    files = [sorted((base / stage).glob(f"*-{args.job}.parquet"))[:1] for stage in ("timing", "acceptance")]
    if not all(files):
        raise SystemExit(f"--job={args.job} is not allowed: campaign {args.campaign} holds no timing and acceptance "
                         f"files of that job; use a plan job's config hash (outputs/campaigns/{args.campaign}/plan/)")
    files = [f[0] for f in files]
    model = calibrate(*(pd.read_parquet(f) for f in files))
    t1 = float(model.target.time(1, model.target.ctx_ref))
    costs = CostTable({1: 0.0, 2: 0.0}, {k: float(model.target.time(k + 1, model.target.ctx_ref)) / t1
                                         for k in range(1, 11)})
    register()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfgs = {n: compose("config", overrides=["k_policy=cost_model", "drafter=prompt_lookup", *o])
                for n, o in POLICIES.items() if o is not None}
    pair = load_pair(args.target, args.draft, args.device, args.dtype)
    rows = []
    for p, prompt, new in greedy_continuations(pair, args.prompts, args.max_new_tokens):
        for policy_name, overrides in POLICIES.items():
            policy = FixedK(2) if overrides is None else policy_spec(cfgs[policy_name].k_policy).build(
                2, Prices(costs, model_drafts=False))  # prompt lookup: no draft model
            trace, skipped = replay(prompt, new, policy)
            rows.append({"prompt_id": p.id, "kind": p.kind, "policy": policy_name, "iterations": len(trace.proposed),
                         "plain_steps_with_match": skipped, "tokens": int(trace.tokens),
                         "mean_k": float(trace.proposed.mean()), "predicted_speedup": float(model.speedup(trace)),
                         "job": args.job})
    df = pd.DataFrame(rows)
    k2 = df[df.policy == "fixed k=2"].set_index("prompt_id")
    df["iterations_ratio_to_k2"] = df.iterations / df.prompt_id.map(k2.iterations)
    df["speedup_ratio_to_k2"] = df.predicted_speedup / df.prompt_id.map(k2.predicted_speedup)
    write_parquet(df, SCHEMA, args.out)
    print(df.pivot(index="prompt_id", columns="policy", values="iterations").to_string())
    ratios = df.pivot(index="prompt_id", columns="policy", values="speedup_ratio_to_k2")
    print(ratios.round(3).to_string())
    print("median over prompts of the predicted speed-up's ratio to fixed k=2:")
    print(ratios.median().round(3).to_string())
    print(f"wrote {args.out} (priced by plan job {args.job} of campaign {args.campaign})")


if __name__ == "__main__":
    main()
