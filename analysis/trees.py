"""Tree-shaped drafts against chains: tokens per pass, acceptance per depth, speed-ups, and the pass-time curve.

    python -m analysis.trees     (reads outputs/campaigns/<trees_campaign>/, writes outputs/analysis/trees/,
                                  outputs/figures/tree_pass_curve.png, outputs/metrics/detail/trees.json)

Speed rows (``+sweep=trees``): plain, chains and trees in the same rotated blocks. Per pair, kind (and all
kinds) and configuration: runs, mean tree nodes (a chain's k), the mean width of the target's pass (new
tokens: pending + proposals), accepted tokens per target pass, the acceptance at each depth (proposals
accepted at depth d over those checked there, pooled over runs), the speed-up (median of within-block
ratios to the adjacent plain run, 95% distribution-free interval) and the speed-up predicted by pricing each run's
own passes at the timed costs (``speclab.trees.pricing``). Then, per pair and kind, the best tree against the
best chain, and each tree against the chain whose pass is as wide (k = nodes), with the median of their
within-block ratios and its interval. The timing rows give the target's pass over 1 + n tree nodes (its 4D
mask) beside a chain's pass over as many tokens, in target steps: where that curve is flat a tree's extra
candidates cost nothing, where it rises they cost their width. Drifted jobs are left out as everywhere.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common import (bootstrap_ci, bootstrap_settings, load_params, markdown_table, read_stage_if_any,
                             run_script, save_figure, save_json, save_table)
from analysis.drift import drift_table, drop_drifted
from analysis.inputs import AnalysisError, campaign_dir
from speclab.specs.tree_shapes import is_tree, parse_tree
from speclab.trees.pricing import CostCurve, parse_counts, predicted_speedup
from store.files import atomic_write_text

import matplotlib.pyplot as plt  # noqa: E402  (analysis.common selects the headless backend first)

ALL = "all"
BLOCK = ["config_hash", "round", "block"]


def config_of(rows: pd.DataFrame) -> pd.Series:
    """``chain model k=4``, ``chain prompt_lookup k=4``, ``tree static:3-2-1-1``, ``plain``."""
    tree = rows.drafter.map(is_tree)
    label = np.where(tree, "tree " + rows.drafter.str.removeprefix("tree:"),
                     "chain " + rows.drafter + " k=" + rows.k.astype(str))
    return pd.Series(np.where(rows.arm == "plain", "plain", label), index=rows.index)


def pass_costs(timing: pd.DataFrame) -> pd.DataFrame:
    """Per pair and model (target, target_tree, draft) and pass width: the median time over jobs and prompts."""
    passes = timing[timing.context_len > 0]
    return passes.groupby(["pair", "model", "pass_len"]).median_s.median().reset_index()


def curves(costs: pd.DataFrame, pair: str) -> tuple[CostCurve, CostCurve, CostCurve, float] | None:
    """The pair's draft, chain-verify and tree-verify curves and its target step (None when not timed)."""
    c = costs[costs.pair == pair]
    table = {m: dict(zip(g.pass_len.astype(int), g.median_s)) for m, g in c.groupby("model")}
    if "target" not in table or "draft" not in table or 1 not in table["target"]:
        return None
    tree = {1: table["target"][1], **table.get("target_tree", {})}  # an empty tree is a plain step
    return (CostCurve.from_table(table["draft"]), CostCurve.from_table(table["target"]), CostCurve.from_table(tree),
            float(table["target"][1]))


def predicted(rows: pd.DataFrame, costs: pd.DataFrame) -> pd.Series:
    """Each speculative run's speed-up as priced from its own passes (NaN where the pair was not timed)."""
    out = pd.Series(np.nan, index=rows.index)
    for pair, g in rows.groupby("pair"):
        cv = curves(costs, pair)
        if cv is None:
            continue
        draft, chain, tree, step = cv
        for i, r in g.iterrows():
            if r.arm == "plain" or not r.loop_new_tokens or r.loop_new_tokens != r.loop_new_tokens:
                continue
            out[i] = predicted_speedup(parse_counts(r.draft_calls_by_width), parse_counts(r.passes_by_width),
                                       int(r.loop_new_tokens), draft, tree if is_tree(r.drafter) else chain, step)
    return out


def depth_acceptance(g: pd.DataFrame) -> str:
    """Acceptance at depth 1, 2, ...: accepted over checked at that depth, pooled over the runs."""
    checked, accepted = {}, {}
    for c_text, a_text in zip(g.checked_by_depth, g.accepted_by_depth):
        if not isinstance(c_text, str) or not c_text:
            continue
        for d, (c, a) in enumerate(zip(c_text.split(","), a_text.split(",")), start=1):
            checked[d] = checked.get(d, 0) + int(c)
            accepted[d] = accepted.get(d, 0) + int(a)
    return " ".join(f"{accepted[d] / checked[d]:.2f}" for d in sorted(checked) if checked[d])


def pass_width(g: pd.DataFrame) -> float:
    """The mean width (new tokens) of the target's passes in the runs' loops."""
    total = {}
    for text in g.passes_by_width:
        for w, n in parse_counts(text).items():
            total[w] = total.get(w, 0) + n
    count = sum(total.values())
    return sum(w * n for w, n in total.items()) / count if count else float("nan")


def arm_table(rows: pd.DataFrame, boot: dict) -> pd.DataFrame:
    out = []
    pooled = pd.concat([rows, rows.assign(kind=ALL)], ignore_index=True)
    for (pair, kind, config), g in pooled[pooled.arm != "plain"].groupby(["pair", "kind", "config"], sort=True):
        ratios = g.ratio_to_adjacent_plain.to_numpy()
        lo, hi = bootstrap_ci(ratios, np.median, **boot)
        tree = is_tree(g.drafter.iloc[0])
        out.append({"pair": pair, "target_dtype": g.dtype.iloc[0], "kind": kind, "config": config,
                    "form": "tree" if tree else "chain", "runs": len(g),
                    "nodes": float(g.tree_nodes.mean()) if tree else float(g.k.iloc[0]),
                    "pass_width": pass_width(g), "tokens_per_pass": float(g.tokens_per_pass.mean()),
                    "alpha_by_depth": depth_acceptance(g), "speedup": float(np.median(ratios)),
                    "speedup_lo": lo, "speedup_hi": hi, "predicted": float(g.predicted.median()),
                    "identical_share": float(g.identical_to_plain.mean())})
    return pd.DataFrame(out)


def within_blocks(rows: pd.DataFrame, a: str, b: str) -> np.ndarray:
    """tokens/s of configuration ``a`` over ``b`` in each block that ran both."""
    x = rows[rows.config == a].set_index(BLOCK).tokens_per_s
    y = rows[rows.config == b].set_index(BLOCK).tokens_per_s
    both = x.index.intersection(y.index)
    return (x[both] / y[both]).to_numpy()


def comparisons(rows: pd.DataFrame, arms: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per pair and kind: the best tree vs the best chain, and each tree vs the chain of the same pass width."""
    out = []
    pooled = pd.concat([rows, rows.assign(kind=ALL)], ignore_index=True)
    for (pair, kind), a in arms.groupby(["pair", "kind"], sort=True):
        sub = pooled[(pooled.pair == pair) & (pooled.kind == kind)]
        trees, chains = a[a.form == "tree"], a[a.form == "chain"]
        if trees.empty or chains.empty:
            continue
        pairs = [("best", trees.loc[trees.speedup.idxmax()], chains.loc[chains.speedup.idxmax()])]
        model_chains = chains[chains.config.str.startswith("chain model")]
        for t in trees.itertuples():
            nodes = parse_tree(t.config.removeprefix("tree ")).nodes
            same = model_chains[model_chains.nodes == nodes]
            if nodes and len(same):
                pairs.append(("same width", t, same.iloc[0]))
        for how, t, c in pairs:
            r = within_blocks(sub, t.config, c.config)
            lo, hi = bootstrap_ci(r, np.median, **boot)
            out.append({"pair": pair, "target_dtype": a.target_dtype.iloc[0], "kind": kind, "compared": how,
                        "tree": t.config, "tree_speedup": t.speedup, "tree_tokens_per_pass": t.tokens_per_pass,
                        "chain": c.config, "chain_speedup": c.speedup, "chain_tokens_per_pass": c.tokens_per_pass,
                        "tree_over_chain": float(np.median(r)) if len(r) else np.nan, "lo": lo, "hi": hi,
                        "blocks": len(r)})
    return pd.DataFrame(out)


def curve_table(costs: pd.DataFrame) -> pd.DataFrame:
    """Per pair and width: the chain's and the tree's target pass in target steps."""
    out = []
    for pair, c in costs.groupby("pair"):
        step = c[(c.model == "target") & (c.pass_len == 1)].median_s
        if step.empty:
            continue
        for model, label in (("target", "chain"), ("target_tree", "tree")):
            for r in c[c.model == model].itertuples():
                out.append({"pair": pair, "pass": label, "width": int(r.pass_len),
                            "nodes": int(r.pass_len) - 1, "ms": 1e3 * r.median_s,
                            "steps": r.median_s / float(step.iloc[0])})
    return pd.DataFrame(out)


def figure(curve: pd.DataFrame, dtypes: dict, path: Path) -> None:
    pairs = sorted(curve.pair.unique())
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.2 * len(pairs), 3.8), squeeze=False, sharey=True)
    for ax, pair in zip(axes[0], pairs):
        for label, style in (("chain", "o-"), ("tree", "s--")):
            g = curve[(curve.pair == pair) & (curve["pass"] == label)].sort_values("width")
            ax.plot(g.width, g.steps, style, label="chain pass (causal)" if label == "chain" else "tree pass (4D mask)")
        ax.axhline(1.0, color="grey", lw=1)
        ax.set(title=f"{pair} (target {dtypes.get(pair, '?')})", xlabel="new tokens in the pass (tree: nodes + 1)",
               xscale="log")
    axes[0][0].set_ylabel("target pass / one-token step")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("The target's pass time over its width: a tree's extra candidates cost what this curve adds")
    save_figure(fig, path)


def metrics(comp: pd.DataFrame) -> dict:
    out: dict = {}
    for r in comp[comp.compared == "best"].itertuples():
        out.setdefault(r.pair, {})[r.kind] = {
            "best_tree": r.tree, "tree_speedup": r.tree_speedup, "best_chain": r.chain,
            "chain_speedup": r.chain_speedup,
            "tree_over_chain": r.tree_over_chain, "tree_tokens_per_pass": r.tree_tokens_per_pass,
            "chain_tokens_per_pass": r.chain_tokens_per_pass}
    return out


def verdicts(comp: pd.DataFrame, arms: pd.DataFrame, curve: pd.DataFrame) -> list[str]:
    """One line per pair: the best tree against the best chain over all kinds, and what their passes cost."""
    out = []
    for r in comp[(comp.compared == "best") & (comp.kind == ALL)].itertuples():
        a = arms[(arms.pair == r.pair) & (arms.kind == ALL)].set_index("config")
        word = ("faster than" if r.lo > 1 else "slower than" if r.hi < 1 else "not told apart from") if r.lo == r.lo \
            else "compared in too few blocks with"
        line = (f"- **{r.pair}** (target {r.target_dtype}): the best tree, {r.tree} (x{r.tree_speedup:.2f} over "
                f"plain, {r.tree_tokens_per_pass:.2f} tokens per pass), is {word} the best chain, {r.chain} "
                f"(x{r.chain_speedup:.2f}, {r.chain_tokens_per_pass:.2f} tokens per pass): tree/chain "
                f"{r.tree_over_chain:.2f}"
                + (f" ({r.lo:.2f}-{r.hi:.2f}, {r.blocks} blocks)" if r.lo == r.lo else ""))
        c = curve[curve.pair == r.pair] if len(curve) else pd.DataFrame(columns=["pass", "width", "steps"])
        tree_w, chain_w = a.pass_width.get(r.tree, np.nan), a.pass_width.get(r.chain, np.nan)
        cost = (lambda label, w: float(np.interp(w, *c[c["pass"] == label].sort_values("width")[["width", "steps"]]
                                                 .to_numpy().T)) if (c["pass"] == label).any() and w == w else np.nan)
        tc, cc = cost("tree", tree_w), cost("chain", chain_w)
        if tc == tc and cc == cc:
            line += (f"; its passes are {tree_w:.1f} tokens wide on average and cost {tc:.2f} target steps, the "
                     f"chain's {chain_w:.1f} and {cc:.2f}")
        out.append(line + ".")
    return out


def interval(lo: pd.Series, hi: pd.Series) -> list[str]:
    return [f"{a:.2f}-{b:.2f}" if a == a else "" for a, b in zip(lo, hi)]


def markdown(campaign: str, arms: pd.DataFrame, comp: pd.DataFrame, curve: pd.DataFrame) -> str:
    s = [f"## Tree-shaped drafts vs chains (campaign {campaign})\n"]
    if arms.empty:
        s.append(f"Not measured: campaign {campaign!r} holds no speed runs with tree arms "
                 "(`python -m pipeline.run +sweep=trees`).\n")
        return "\n".join(s)
    s.append("Trees and chains ran in the same rotated blocks as plain decoding (`+sweep=trees`). tree/chain = median "
             "of within-block ratios of the two configurations' tokens/s (95% distribution-free interval); 'same width' "
             "sets a tree beside the draft-model chain whose pass is as wide (k = nodes).\n")
    s += verdicts(comp, arms, curve) + [""]
    best = comp[comp.compared == "best"].assign(interval=lambda d: interval(d.lo, d.hi))
    s += ["**Best tree vs best chain**\n", markdown_table(best[[
        "pair", "target_dtype", "kind", "tree", "tree_speedup", "tree_tokens_per_pass", "chain", "chain_speedup",
        "chain_tokens_per_pass", "tree_over_chain", "interval", "blocks"]], ".2f"), ""]
    same = comp[comp.compared == "same width"].assign(interval=lambda d: interval(d.lo, d.hi))
    if len(same):
        s += ["**Each tree vs the chain of the same verification width** (all kinds pooled)\n",
              markdown_table(same[same.kind == ALL][["pair", "target_dtype", "tree", "tree_speedup", "chain",
                                                     "chain_speedup", "tree_over_chain", "interval", "blocks"]], ".2f"),
              ""]
    if len(curve):
        wide = curve.pivot_table(index=["pair", "nodes"], columns="pass", values="steps").reset_index()
        s += ["**The target's pass over 1 + n tree nodes, in one-token steps** (chain: a causal pass over as many "
              "tokens; figure `figures/tree_pass_curve.png`)\n", markdown_table(wide, ".2f"), ""]
    pooled = arms[arms.kind == ALL].assign(interval=lambda d: interval(d.speedup_lo, d.speedup_hi))
    s += ["**Every configuration, all kinds pooled** (acceptance by depth: d1 d2 ...; predicted: the runs' own passes "
          "priced at the timed costs)\n", markdown_table(pooled[[
              "pair", "config", "runs", "nodes", "pass_width", "tokens_per_pass", "alpha_by_depth", "speedup",
              "interval", "predicted", "identical_share"]], ".2f"), ""]
    return "\n".join(s)


def main() -> None:
    params = load_params()
    campaign = params.get("trees_campaign")
    if not campaign:
        raise AnalysisError("params.yaml names no trees_campaign: add `trees_campaign: <campaign>`")
    boot = bootstrap_settings(params)
    outputs = params["outputs_dir"]
    campaign_dir(outputs, campaign)
    speed, timing = (read_stage_if_any(outputs, stage, campaign) for stage in ("speed", "timing"))
    costs = pass_costs(timing) if not timing.empty else pd.DataFrame(columns=["pair", "model", "pass_len", "median_s"])
    arms = comp = pd.DataFrame()
    if not speed.empty:
        speed = drop_drifted(speed, drift_table(speed, float(params["drift"]["max_ratio"])))
    if not speed.empty and speed.drafter.map(is_tree).any():
        rows = speed.assign(config=config_of(speed))
        rows = rows.assign(predicted=predicted(rows, costs))
        arms = arm_table(rows, boot)
        comp = comparisons(rows, arms, boot)
    curve = curve_table(costs)
    out = Path(params["analysis_dir"]) / "trees"
    save_table(arms, out / "arms.parquet")
    save_table(comp, out / "tree_vs_chain.parquet")
    save_table(curve, out / "pass_curve.parquet")
    dtypes = dict(zip(speed.pair, speed.dtype)) if not speed.empty else {}
    if len(curve):
        figure(curve, dtypes, Path(params["figures_dir"]) / "tree_pass_curve.png")
    save_json(metrics(comp) if len(comp) else {}, Path(params["metrics_dir"]) / "detail" / "trees.json")
    text = markdown(campaign, arms, comp, curve)
    atomic_write_text(out / "section.md", text)
    print(text)


if __name__ == "__main__":
    run_script("analysis.trees", main)
