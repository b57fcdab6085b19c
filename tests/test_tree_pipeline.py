"""Tree arms in the pipeline: specs from config, the speed stage's tree arms in the rotated blocks, the timing
stage's pass over tree nodes, the pricing of an iteration's passes, and the analysis's tree-vs-chain tables."""
import inspect

import numpy as np
import pandas as pd
import pytest

from analysis.trees import arm_table, comparisons, config_of, curve_table, depth_acceptance, markdown, pass_width
from pipeline.config.schema import ConfigError, check_config
from pipeline.engines.option_checks import check_engine
from pipeline.run import run_parts
from pipeline.jobs.identity import output_path
from pipeline.stages import timing
from speclab.specs.tree_shapes import FAMILIES, parse_tree
from pipeline_helpers import make_cfg
from speclab.trees.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter
from speclab.trees.pricing import CostCurve, parse_counts, predicted_speedup

BOOT = {"samples": 200, "seed": 0, "level": 0.95}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_specs_parse_to_the_constructors_arguments():
    assert parse_tree("static:3-2-1-1").args == {"branching": [3, 2, 1, 1]}
    assert parse_tree("tree:dynamic:5-4-16").args == {"depth": 5, "topk": 4, "nodes": 16}
    assert parse_tree("lookup:2-3").args == {"branches": 2, "depth": 3}
    # Without numbers: the classes' own defaults, written out in the label (one name per shape).
    defaults = {name: inspect.signature(cls).parameters for name, cls in
                (("static", StaticTreeDrafter), ("dynamic", DynamicTreeDrafter), ("lookup", LookupTreeDrafter))}
    assert parse_tree("static").args["branching"] == list(defaults["static"]["branching"].default)
    assert parse_tree("dynamic").args == {n: defaults["dynamic"][n].default for n in ("depth", "topk", "nodes")}
    assert parse_tree("static").label == "static:" + "-".join(map(str, defaults["static"]["branching"].default))
    assert parse_tree("static:3-2-1-1").nodes == 3 + 6 + 6 + 6 and parse_tree("static:3-2-1-1").depth == 4
    assert parse_tree("dynamic:4-2-8").nodes == 8 and parse_tree("lookup:4-6").nodes == 0
    assert set(FAMILIES) == {"static", "dynamic", "lookup"}


@pytest.mark.parametrize("bad", ["static:0", "static:2-x", "dynamic:5-4", "bush", "lookup:1-2-3", "dynamic:0-1-1"])
def test_a_bad_spec_is_one_line_naming_it(bad):
    with pytest.raises(ValueError) as err:
        parse_tree(bad)
    assert repr(bad) in str(err.value) and "\n" not in str(err.value)


def test_config_refuses_a_bad_tree_before_any_model_loads(tmp_path):
    cfg = make_cfg(tmp_path, "stage=acceptance", "stage.arms=[{tree:'static:2-1'},{tree:'static:2-0'}]")
    with pytest.raises(ConfigError, match=r"stage.arms entry \{'tree': 'static:2-0'\}: .*static:2-0"):
        check_engine(cfg, ["acceptance"])
    cfg = make_cfg(tmp_path, "stage=speed", "stage.arms=[{},{tree:'static:2-0'}]")
    with pytest.raises(ConfigError, match=r"stage.arms entry .*static:2-0"):
        check_engine(cfg, ["speed"])
    with pytest.raises(ConfigError, match="stage.tree_nodes"):
        check_config(make_cfg(tmp_path, "stage=timing", "stage.tree_nodes=[0]"), ("timing",))


def test_speed_stage_runs_tree_arms_in_the_rotated_blocks(tmp_path):
    cfg = make_cfg(tmp_path, "stage=speed", "stage.ks=[2]", "stage.timing_repeats=2", "stage.timing_warmup=0",
                   "stage.arms=[{},{tree:'static:2-1'},{tree:'dynamic:2-2-3'},{tree:'lookup:2-2'}]", "pair.draft=copy",
                   "max_new_tokens=10")
    run_parts(cfg)
    df = pd.read_parquet(output_path(cfg, "speed"))
    trees = df[df.drafter.str.startswith("tree:")]
    assert set(trees.drafter) == {"tree:static:2-1", "tree:dynamic:2-2-3", "tree:lookup:2-2"}
    assert (trees.groupby("block").size() == 3).all() and (df.groupby("block").size() == 5).all()
    assert sorted(df[df.block == 0].position) == list(range(5))
    assert df[df.position == 0].drafter.nunique() > 1  # trees take their turn first too
    assert df[df.arm == "speculative"].identical_to_plain.all()
    assert (trees.k == trees.drafter.map(lambda d: parse_tree(d).depth)).all()
    static = trees[trees.drafter == "tree:static:2-1"]
    # A perfect draft: every iteration of a full tree accepts its whole depth.
    assert (static.tree_nodes > 2).all() and (static.tree_nodes <= 4).all()
    assert trees.verify_before_s.isna().all() and df[df.drafter == "model"].verify_before_s.notna().all()
    for r in df[df.arm == "speculative"].itertuples():
        checked = [int(x) for x in r.checked_by_depth.split(",")]
        accepted = [int(x) for x in r.accepted_by_depth.split(",")]
        assert len(checked) == r.k and all(a <= c for a, c in zip(accepted, checked))
        assert sum(accepted) / sum(checked) == pytest.approx(r.acceptance_rate)
        passes = parse_counts(r.passes_by_width)
        assert 0 < sum(passes.values()) <= r.iterations and r.loop_new_tokens <= r.new_tokens
        if r.drafter == "tree:static:2-1":  # pending token + the 2 + 2 nodes of a full tree
            assert max(passes) == 5 and set(parse_counts(r.draft_calls_by_width)) <= {1, 2}
        if r.drafter == "model":  # a perfect draft: each call after the first all-accepted iteration catches up 2
            calls = parse_counts(r.draft_calls_by_width)
            assert sum(calls.values()) == 2 * passes.get(3, 0) and calls.get(2, 0) > 0  # k = 2: 2 calls a full pass


def test_timing_stage_times_tree_passes(tmp_path):
    cfg = make_cfg(tmp_path, "stage=timing", "stage.repeats=3", "stage.warmup=1", "stage.pass_lengths=[1,3]",
                   "stage.tree_nodes=[2,8]")
    run_parts(cfg)
    df = pd.read_parquet(output_path(cfg, "timing"))
    tree = df[df.model == "target_tree"]
    assert sorted(tree.pass_len) == [3, 9] and (tree.median_s > 0).all()
    assert set(df[df.model != "target_tree"].pass_len) == {1, 3}
    m = timing.summarize(df, cfg).metrics
    assert m["c_tree_nodes2"] == pytest.approx(tree[tree.pass_len == 3].median_s.iloc[0]
                                               / df[(df.model == "target") & (df.pass_len == 1)].median_s.iloc[0])
    assert "c_verify_n9" not in m


def test_pricing_an_iteration_from_its_passes():
    assert parse_counts("1:12,3:4") == {1: 12, 3: 4} and parse_counts("") == {} and parse_counts(None) == {}
    curve = CostCurve.from_table({1: 1.0, 3: 2.0})
    assert curve(2) == pytest.approx(1.5) and curve(5) == pytest.approx(3.0) and curve(1) == 1.0
    draft, verify = CostCurve.from_table({1: 0.2, 2: 0.3}), CostCurve.from_table({1: 1.0, 5: 2.0})
    # 10 iterations: calls 1 x 10 and 2 x 20 (0.2 * 10 + 0.3 * 20 = 8), passes of 5 tokens (2.0 * 10 = 20): 28 s
    # for 30 tokens; plain pays 1.0 s a token.
    assert predicted_speedup({1: 10, 2: 20}, {5: 10}, 30, draft, verify, 1.0) == pytest.approx(30 / 28)
    assert np.isnan(predicted_speedup({}, {}, 0, draft, verify, 1.0))


def _rows():
    """Three blocks per kind (six pooled: an interval at 95%); in each: plain, chain k=2 (x1.2), tree static:2-1
    (x1.5 in code, x0.9 in prose)."""
    rows = []
    for kind in ("code", "prose"):
        for block in range(3):
            for arm, drafter, k, factor in (("plain", "none", 0, 1.0), ("speculative", "model", 2, 1.2),
                                            ("speculative", "tree:static:2-1", 2, 1.5 if kind == "code" else 0.9)):
                rows.append({"pair": "p", "dtype": "bfloat16", "kind": kind, "config_hash": f"h{kind}", "round": 0,
                             "block": block, "prompt_id": f"{kind}{block}", "arm": arm, "drafter": drafter, "k": k,
                             "tokens_per_s": 10 * factor, "ratio_to_adjacent_plain": factor,
                             "tokens_per_pass": 1 + factor, "tree_nodes": 4.0 if "tree" in drafter else 0.0,
                             "checked_by_depth": "4,3" if k else "", "accepted_by_depth": "3,1" if k else "",
                             "passes_by_width": "3:4" if drafter == "model" else "5:4" if k else "",
                             "identical_to_plain": True, "predicted": 1.0})
    return pd.DataFrame(rows)


def test_analysis_tables_from_rows():
    rows = _rows()
    rows = rows.assign(config=config_of(rows))
    assert set(rows.config) == {"plain", "chain model k=2", "tree static:2-1"}
    arms = arm_table(rows, BOOT).set_index(["kind", "config"])
    tree = arms.loc[("code", "tree static:2-1")]
    assert tree.form == "tree" and tree.nodes == 4.0 and tree.pass_width == 5.0 and tree.speedup == pytest.approx(1.5)
    assert arms.loc[("all", "tree static:2-1")].alpha_by_depth == "0.75 0.33"  # (3+3+3+3)/(4*4), 4/12
    assert arms.loc[("code", "chain model k=2")].nodes == 2
    comp = comparisons(rows, arms.reset_index(), BOOT).set_index(["kind", "compared"])
    assert comp.loc[("code", "best"), "tree_over_chain"] == pytest.approx(1.25)
    assert comp.loc[("prose", "best"), "tree_over_chain"] == pytest.approx(0.75)
    assert ("code", "same width") not in comp.index  # no chain with k = 4 ran
    text = markdown("trees", arms.reset_index(), comp.reset_index(), pd.DataFrame())
    assert "Best tree vs best chain" in text and "0.75 0.33" in text
    # Pooled: x1.25 in code's blocks, x0.75 in prose's: the interval spans 1, and the verdict says so.
    assert "is not told apart from the best chain, chain model k=2" in text


def test_depth_acceptance_and_width_pool_runs():
    g = pd.DataFrame({"checked_by_depth": ["2,1", "2,2", None], "accepted_by_depth": ["1,1", "2,0", None],
                      "passes_by_width": ["3:2", "5:2", ""]})
    assert depth_acceptance(g) == "0.75 0.33"
    assert pass_width(g) == 4.0
    costs = pd.DataFrame({"pair": ["p"] * 3, "model": ["target", "target", "target_tree"], "pass_len": [1, 3, 3],
                          "median_s": [0.1, 0.2, 0.25]})
    curve = curve_table(costs).set_index(["pass", "width"])
    assert curve.loc[("tree", 3), "steps"] == pytest.approx(2.5) and curve.loc[("chain", 1), "steps"] == 1.0


def test_no_tree_runs_says_so():
    assert "Not measured" in markdown("trees", pd.DataFrame(), pd.DataFrame(), pd.DataFrame())


def test_acceptance_and_plan_rank_trees_beside_chains(tmp_path):
    cfg = make_cfg(tmp_path, "stage=plan",
                   "stage.arms=[{drafter:model},{drafter:prompt_lookup},{drafter:hybrid},{tree:'static:2-1'},"
                   "{tree:'lookup:2-2'}]", "stage.tree_nodes=[2,4]",
                   "stage.repeats=2", "stage.warmup=0", "stage.acceptance_ks=[1,2]", "pair.draft=copy",
                   "max_new_tokens=10")
    run_parts(cfg)
    acc = pd.read_parquet(output_path(cfg, "acceptance"))
    trees = acc[acc.drafter.str.startswith("tree:")]
    assert set(trees.drafter) == {"tree:static:2-1", "tree:lookup:2-2"} and not trees.replayed.any()
    static = trees[trees.drafter == "tree:static:2-1"]
    assert (static.proposed <= 2).all() and (static.tree_nodes >= static.proposed).all()
    # A perfect draft: a full tree (2 + 2 nodes, two draft calls: the catch-up, then a level of 2) is accepted whole.
    full = static[static.tree_nodes == 4]
    assert len(full) and (full.accepted == 2).all() and (full.draft_call_width == 2).all()
    chains = acc[~acc.drafter.str.startswith("tree:")]
    assert (chains.tree_nodes == 0).all() and (chains.draft_call_width == 1).all()
    from speclab.costs.planning import traces

    runs = {key[2]: tr for key, tr, _ in traces(acc[acc.prompt_id == acc.prompt_id.iloc[0]])}
    assert runs["tree:static:2-1"].tree and not runs["model"].tree and runs["model"].nodes is None
    assert list(runs["tree:static:2-1"].nodes) == list(static[static.prompt_id == acc.prompt_id.iloc[0]].tree_nodes)
    plan = pd.read_parquet(output_path(cfg, "plan"))
    ranked = plan[plan.kind == "all"].set_index("drafter")
    assert {"tree:static:2-1", "tree:lookup:2-2"} <= set(ranked.index)
    assert np.isfinite(ranked.loc["tree:static:2-1", "predicted"]) and ranked.loc["tree:static:2-1", "k"] == 2


def test_the_time_model_prices_a_tree_by_its_nodes_and_level_widths():
    from speclab.costs.time_model import LoopCosts, PassModel, TimeModel, Trace

    flat = (lambda table: PassModel(table, {n: 0.0 for n in table}, 50.0, (0.0, 0.001)))
    target, tree = flat({1: 1.0, 3: 1.5, 7: 2.0}), flat({1: 1.0, 3: 1.7, 7: 3.0})
    draft = flat({1: 0.2, 2: 0.25, 3: 0.3})
    tr = Trace(prompt_len=10, proposed=np.array([2, 2]), new_tokens=np.array([3, 1]), length=np.array([10, 13]),
               draft_fed=np.array([1, 3]), draft_calls=np.array([2, 2]), uses_model=True, uses_lookup=False,
               call_width=np.array([3.0, 3.0]), nodes=np.array([6, 6]), tree=True)
    parts = TimeModel(target, draft, LoopCosts(), tree).speculative(tr).parts
    assert parts["verify"] == pytest.approx(2 * 3.0)  # the tree pass over 6 nodes + 1, not a chain's 3 tokens
    # Two calls an iteration, each priced as a 3-token level; the first call's catch-up adds its own width's extra.
    assert parts["draft_steps"] == pytest.approx(2 * 2 * 0.3)
    assert parts["catch_up"] == pytest.approx(0.3 - 0.2)
    chain = Trace(prompt_len=10, proposed=np.array([2, 2]), new_tokens=np.array([3, 1]), length=np.array([10, 13]),
                  draft_fed=np.array([1, 3]), draft_calls=np.array([2, 2]), uses_model=True, uses_lookup=False)
    chain_parts = TimeModel(target, draft, LoopCosts(), tree).speculative(chain).parts
    assert chain_parts["verify"] == pytest.approx(2 * 1.5) and chain_parts["draft_steps"] == pytest.approx(4 * 0.2)
