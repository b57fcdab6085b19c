"""From timing and acceptance rows to a time model, per-run predictions and a recommendation per kind.

The glue between the stages' tables and ``speclab.costs.time_model`` (pure numpy), shared by the plan
stage (which recommends) and the analysis (which validates the predictions against the speed stage).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import norm

from speclab.costs.engine_plan import engine_costs, fit_overheads, predict_requests
from speclab.specs.arms import drafter_looks_up, drafter_runs_model
from speclab.stats.estimators import alpha_hat
from speclab.stats.intervals import median_ci, prediction_interval
from speclab.costs.kind_rule import HeldOut, RULE
from speclab.costs.kind_rule import held_out as kind_held_out
from speclab.costs.sample_rule import closest_rival, is_settled
from speclab.costs.time_model import PARTS, PassModel, TimeModel, Trace, calibrate_loop
from speclab.specs.tree_shapes import is_tree

RUN_KEYS = ["prompt_id", "kind", "drafter", "k_policy", "k"]
CONFIG_KEYS = ["drafter", "k_policy", "k"]
TRACE_COLUMNS = ["prompt_len", "length", "draft_fed", "draft_calls"]
LOOP_TIMES = ["draft_s", "verify_s", "rollback_s", "total_s"]  # absent on replayed runs (stage.replay)
IQR_PER_SD = 2 * norm.ppf(0.75)  # a normal's interquartile range in standard deviations (1.349)


def pass_models(timing: pd.DataFrame) -> tuple[PassModel, PassModel]:
    """Target and draft pass models from timing rows (every prompt and context timed)."""
    out = []
    for role in ("target", "draft"):
        sub = timing[timing.model == role]
        if sub.empty:
            raise ValueError(f"the timing rows hold no {role!r} model: the time model needs both")
        out.append(PassModel.fit(sub.pass_len.to_numpy(), sub.context_len.to_numpy(), sub.median_s.to_numpy()))
    return out[0], out[1]


def tree_pass_model(timing: pd.DataFrame) -> PassModel | None:
    """The target's pass over a tree (timing rows ``target_tree``, stage.tree_nodes), or None when not timed."""
    sub = timing[timing.model == "target_tree"]
    if sub.empty:
        return None
    return PassModel.fit(sub.pass_len.to_numpy(), sub.context_len.to_numpy(), sub.median_s.to_numpy())


def drafter_parts(drafter: str) -> tuple[bool, bool]:
    """Whether a drafter runs a draft model and whether it looks up n-grams every iteration."""
    return drafter_runs_model(drafter), drafter_looks_up(drafter)


def measured(acc: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs the loop ran for real (a replayed run has counts, not times)."""
    return acc[~acc.replayed.fillna(False).astype(bool)] if "replayed" in acc else acc


def check_traceable(acc: pd.DataFrame) -> None:
    missing = [c for c in TRACE_COLUMNS if c not in acc or acc[c].isna().any()]
    missing += [c for c in LOOP_TIMES if c not in acc or measured(acc)[c].isna().any()]
    if missing:
        raise ValueError(f"acceptance rows lack {missing}: they were written before the time model; "
                         "rerun the acceptance stage (force=true) to record them")


def traces(acc: pd.DataFrame) -> list[tuple[tuple, Trace, pd.DataFrame]]:
    """One Trace per run (prompt, drafter, policy, k), in iteration order, with its rows."""
    check_traceable(acc)
    if "config_hash" in acc:
        jobs = acc.groupby(RUN_KEYS).config_hash.nunique()
        if (jobs > 1).any():  # their iterations would interleave into one impossible run
            key = jobs[jobs > 1].index[0]
            raise ValueError(f"acceptance rows of {int(jobs.max())} jobs describe one run {dict(zip(RUN_KEYS, key))}: "
                             "pass the rows of one job per run")
    out = []
    for key, g in acc.sort_values("iteration").groupby(RUN_KEYS, sort=True):
        drafter = key[2]
        uses_model, uses_lookup = drafter_parts(drafter)
        tree = is_tree(drafter)
        out.append((key, Trace(
            prompt_len=int(g.prompt_len.iloc[0]), proposed=g.proposed.to_numpy(), new_tokens=g.new_tokens.to_numpy(),
            length=g.length.to_numpy(), draft_fed=g.draft_fed.to_numpy(), draft_calls=g.draft_calls.to_numpy(),
            uses_model=uses_model, uses_lookup=uses_lookup,
            merged="with_prompt" in g and bool(g.with_prompt.fillna(False).any()),
            call_width=g.draft_call_width.to_numpy(float) if tree else None,
            nodes=g.tree_nodes.to_numpy(int) if tree else None, tree=tree), g))
    return out


def calibrate(timing: pd.DataFrame, acc: pd.DataFrame) -> TimeModel:
    """Pass models from the timing rows, the loop's costs from the acceptance rows' own times."""
    target, draft = pass_models(timing)
    bare = TimeModel(target, draft)
    runs = traces(measured(acc))
    loop = calibrate_loop(bare, [tr for _, tr, _ in runs],
                          *([g[c].to_numpy() for _, _, g in runs] for c in LOOP_TIMES))
    return TimeModel(target, draft, loop, tree_pass_model(timing))


def predict_runs(model: TimeModel, acc: pd.DataFrame) -> pd.DataFrame:
    """Per acceptance run: the predicted speed-up, its parts (seconds), and the i.i.d. formula's number."""
    rows = []
    for key, tr, g in traces(acc):
        spec, plain = model.speculative(tr), model.plain(tr.prompt_len, tr.tokens)
        k = int(key[4])
        a = alpha_hat(g.accepted, g.proposed)
        rows.append({**dict(zip(RUN_KEYS, key)), "tokens": tr.tokens, "iterations": len(tr.proposed),
                     "alpha": a, "predicted": plain.total / spec.total,
                     "predicted_iid": model.iid(a, k, tr.uses_model) if key[3] == "fixed" and a == a else np.nan,
                     "plain_s": plain.total, "spec_s": spec.total, **{f"{p}_s": spec.parts[p] for p in PARTS}})
    return pd.DataFrame(rows)


def price_runs(timing: pd.DataFrame, calibration: pd.DataFrame, acc: pd.DataFrame,
               counts_iterations: bool = True) -> pd.DataFrame:
    """Every acceptance run of ``acc`` priced by the time model fitted on ``timing`` and ``calibration`` (acceptance
    rows whose measured loop times or requests set the overheads): a plan's own rows price its sample's runs (the
    plan) or other prompts' runs (its price for an unseen prompt). ``counts_iterations``: rows are a loop's
    iterations (speclab's engine); else an engine's requests, priced by its costs and counters."""
    if not counts_iterations:
        costs = engine_costs(timing)
        return predict_requests(costs, acc, fit_overheads(costs, calibration))
    return predict_runs(calibrate(timing, calibration), acc)


def predict_at_blocks(model: TimeModel, acc: pd.DataFrame, speed: pd.DataFrame) -> pd.DataFrame:
    """Per speed row: the predicted speed-up of its configuration on its prompt (the acceptance run's
    trace) and the i.i.d. formula's (that run's alpha-hat; fixed k only), with the time model re-priced
    at the step times taken just before that row's block (``block_target_step_s`` /
    ``block_draft_step_s``). NaN where the block was not timed or no acceptance run matches. The speed
    rows' own times and ratios are not used."""
    runs = {key: (tr, g) for key, tr, g in traces(acc)}
    out = []
    for r in speed.itertuples():
        key = (r.prompt_id, r.kind, r.drafter, r.k_policy, r.k)
        t_step, d_step = getattr(r, "block_target_step_s", np.nan), getattr(r, "block_draft_step_s", np.nan)
        if key not in runs or not (t_step > 0) or not (d_step > 0):
            out.append((np.nan, np.nan))
            continue
        (tr, g), at = runs[key], model.at_steps(t_step, d_step, runs[key][0].prompt_len)
        iid = at.iid(alpha_hat(g.accepted, g.proposed), int(r.k), tr.uses_model) if r.k_policy == "fixed" else np.nan
        out.append((at.speedup(tr), iid))
    return pd.DataFrame(out, index=speed.index, columns=["predicted", "predicted_iid"], dtype=float)


def median_and_interval(values: np.ndarray, level: float) -> tuple[float, float, float]:
    """Median of the given values (one per prompt) and its distribution-free interval at ``level``
    (``speclab.stats.intervals.median_ci``: NaN, no interval, from fewer prompts than it needs: 5 at 90%)."""
    values = np.asarray(values, float)
    lo, hi = median_ci(values, level)
    return float(np.median(values)), lo, hi


PLAIN = {"drafter": "none", "k_policy": "none", "k": 0}  # no speculation: the baseline itself


def per_prompt(pred: pd.DataFrame) -> pd.DataFrame:
    """Predicted speed-ups, one row per prompt and one column per configuration (a (drafter, k_policy, k)
    tuple), plain decoding included at exactly 1."""
    table = pred.assign(cfg=list(zip(*(pred[c] for c in CONFIG_KEYS)))).pivot_table(
        index="prompt_id", columns="cfg", values="predicted")
    table[tuple(PLAIN[c] for c in CONFIG_KEYS)] = 1.0
    return table


def worst_ratios(pred: pd.DataFrame) -> pd.Series:
    """Per configuration: its worst predicted speed-up, over every sample prompt, as a share of that
    prompt's best configuration (plain included at 1). 1 means best on every prompt."""
    table = per_prompt(pred)
    return table.div(table.max(axis=1), axis=0).min(axis=0).rename("worst_ratio")


def held_out(pred: pd.DataFrame, kind: str, level: float) -> HeldOut:
    """The kind's own choice against the robust one, each made without the prompt it is priced on
    (``speclab.costs.kind_rule``); ``pred``: every kind's predictions (the robust choice is made over all of them)."""
    table = per_prompt(pred)
    kinds = pred.drop_duplicates("prompt_id").set_index("prompt_id").kind
    return kind_held_out(table.to_numpy(dtype=float), (kinds.reindex(table.index) == kind).to_numpy(), level)


@dataclass(frozen=True)
class Settled:
    """Whether a kind's sample has told its recommendation apart from every other configuration it priced
    (``speclab.costs.sample_rule``)."""

    runner_up: tuple | None  # (drafter, k_policy, k) of the closest rival (the lowest bound); None: one candidate
    margin: float            # the lower bound, corrected for the rivals and the looks, of the recommendation's mean
                             # speed-up over that rival, a ratio (geometric mean over the kind's prompts); NaN below 2
    prompts: int
    settled: bool            # margin >= 1 - precision: no worse than ``precision`` below any rival, at ``level``
    rivals: int = 0


def settled(pred: pd.DataFrame, chosen: tuple, precision: float, level: float, looks: int = 1) -> Settled:
    """Per prompt of one kind, log(recommended / rival) for every other configuration (plain included); the sample is
    enough when each one's lower bound, at ``level`` corrected for the rivals and the ``looks`` (sample sizes) the plan
    takes, is at least ``1 - precision``: the recommendation is then told apart from every rival, or within
    ``precision`` of it, whichever configuration the sample happened to favour."""
    table = per_prompt(pred)
    values, configs = table.to_numpy(dtype=float), list(table.columns)  # configurations are tuples: by position
    if chosen not in configs or len(configs) < 2:
        return Settled(None, float("nan"), len(values), False)
    b = closest_rival(values, configs.index(chosen), level, looks)
    return Settled(tuple(configs[b.rival]), b.margin, b.prompts, is_settled(b, precision), b.rivals)


def run_noise(timing: pd.DataFrame) -> float:
    """The noise of one measured speed-up, a ratio of a run over its adjacent plain run, as a standard deviation of its
    log: one target pass's spread over its repeats (its quartiles, as a normal's: IQR / 1.349 of the log; the median
    over the timing part's target passes), times sqrt(2) for a ratio of two runs. Not divided by a run's passes:
    adjacent runs differ by the machine's state over seconds, which a run's passes share. On this machine
    (benchmarks/run_noise.py) a prompt's log speed-up varied across a speed job's rounds by an SD of median 0.052
    (34 jobs, 10-90% 0.014-0.110), and this stated median 0.067 (35 timing jobs, 10-90% 0.030-0.186); divided by
    a run's passes it would state a tenth of that. 0 where the timing has no quartiles."""
    t = timing[(timing.model == "target") & (timing.context_len > 0)] if len(timing) else timing
    if not len(t) or "q25_s" not in t:
        return 0.0
    spread = (np.log(t.q75_s.to_numpy(float)) - np.log(t.q25_s.to_numpy(float))) / IQR_PER_SD
    spread = spread[np.isfinite(spread)]
    return float(np.sqrt(2) * np.median(spread)) if len(spread) else 0.0


def widened(lo: float, hi: float, noise: float, level: float) -> tuple[float, float]:
    """An interval for a prompt's speed-up widened by a measurement's noise (``run_noise``) at ``level``."""
    w = float(np.exp(norm.ppf((1 + level) / 2) * noise))
    return lo / w, hi * w


def recommend(pred: pd.DataFrame, level: float = 0.9, noise: float = 0.0) -> pd.DataFrame:
    """Per kind (and 'all'), every configuration's median predicted speed-up over the sample prompts,
    its distribution-free interval at ``level`` (none from fewer prompts than it needs), where an *unseen* prompt of
    the kind falls (``unseen_lo``-``unseen_hi``, covering it with probability ``unseen_coverage``: at least ``level``
    from ``prediction_size_needed(level)`` prompts, the sample's range and its smaller coverage below that;
    speclab.stats.intervals.prediction_interval; widened at ``level`` by ``noise``, the log-SD of a measured speed-up
    (``run_noise``): a check measures each prompt in adjacent runs, so plain itself reads 1 only within that noise),
    and the recommended one. Plain decoding is a candidate at exactly 1: where no
    configuration is predicted to beat it, the advice is not to speculate.

    Over all kinds ('all') the recommendation is the *robust* configuration (the best worst case over every sample
    prompt, ``worst_ratio``); per kind, ``speclab.costs.kind_rule.RULE`` decides between the kind's own best and the
    robust one, and ``cv_gain`` and ``cv_error`` say how the kind's own choice fared against the robust one on prompts
    neither was chosen with (leave one prompt out), on every row of the kind; ``chosen_by`` says why.
    """
    pooled = pd.concat([pred, pred.assign(kind="all")], ignore_index=True) if pred.kind.nunique() > 1 else pred
    rows = [{"kind": kind, **PLAIN, "prompts": g.prompt_id.nunique(), "predicted": 1.0, "predicted_lo": 1.0,
             "predicted_hi": 1.0, "predicted_iid": 1.0, "alpha": float("nan"),
             **dict(zip(("unseen_lo", "unseen_hi"), widened(1.0, 1.0, noise, level))),
             "unseen_coverage": level if noise > 0 else 1.0}
            for kind, g in pooled.groupby("kind", sort=True)]
    for (kind, drafter, policy, k), g in pooled.groupby(["kind", *CONFIG_KEYS], sort=True):
        med, lo, hi = median_and_interval(g.predicted.to_numpy(), level)
        unseen = prediction_interval(g.predicted.to_numpy(), level)
        rows.append({"kind": kind, "drafter": drafter, "k_policy": policy, "k": int(k), "prompts": g.prompt_id.nunique(),
                     "predicted": med, "predicted_lo": lo, "predicted_hi": hi,
                     "predicted_iid": float(g.predicted_iid.median()), "alpha": float(g.alpha.mean()),
                     **dict(zip(("unseen_lo", "unseen_hi"), widened(unseen.lo, unseen.hi, noise, level))),
                     "unseen_coverage": unseen.coverage})
    out = pd.DataFrame(rows)
    out["rank"] = out.groupby("kind").predicted.rank(ascending=False, method="first").astype(int)
    cfg = pd.Series(list(zip(*(out[c] for c in CONFIG_KEYS))), index=out.index)
    worst = worst_ratios(pred)
    out["worst_ratio"] = [float(worst[key]) if key in worst.index else np.nan for key in cfg]
    # The robust choice: best worst case, then the higher pooled median.
    everywhere = out[out.kind == ("all" if "all" in set(out.kind) else out.kind.iloc[0])]
    robust_at = everywhere.sort_values(["worst_ratio", "predicted"], ascending=False).index[0]
    robust = cfg[robust_at]
    out["recommended"], out["chosen_by"], out["cv_gain"], out["cv_error"] = False, "", np.nan, np.nan
    for kind, g in out.groupby("kind", sort=False):
        best = cfg[g["rank"].idxmin()]
        why, pick = f"robust: best worst case over all sample prompts ({out.worst_ratio[robust_at]:.3f} of each one's best)", robust
        if kind != "all":
            h = held_out(pred, kind, level)
            out.loc[g.index, ["cv_gain", "cv_error"]] = [h.gain, h.error]
            said = (f"the kind's own choice gains {100 * h.gain:+.0f}% (± {100 * h.error:.0f}%) over the robust one "
                    f"on prompts neither saw ({h.prompts} left out in turn)")
            if best != robust and h.beyond:
                why, pick = f"kind's best: {said}", best
            elif best != robust:
                why += f"; {said}: not taken by the rule ({RULE})"
        chosen = next(i for i in g.index if cfg[i] == pick)
        out.loc[chosen, ["recommended", "chosen_by"]] = [True, why]
    return out.sort_values(["kind", "rank"]).reset_index(drop=True)
