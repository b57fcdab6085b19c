"""What a job's engine can run, checked before anything loads: each refusal one line naming the value and what
is allowed there.

llama.cpp (engine=llama_cpp) answers requests: token ids, its own timings and counters, its top-n
probabilities. It runs the stages timing, acceptance, speed, divergence and plan; the stages that step inside
the loop (distribution's draws, batch's padded rows) and speclab's own drafters, k policies and trees need
speclab's loop. Its speculative configurations are ``engine.arms`` entries, not ``stage.arms``.
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import ConfigError, DivergenceStage
from pipeline.jobs.arms import engine_name
from pipeline.config.stage_options import chosen

LLAMA = "llama_cpp"
LOOP_ONLY = {"distribution": "it draws the draft's proposals inside the loop",
             "batch": "it runs padded batches of prompts through the loop"}
RUNS_ON_LLAMA = ("timing", "acceptance", "speed", "divergence", "plan")
DEFAULT_ARMS = [{"method": "speculative", "drafter": None, "k_policy": None, "ks": None, "tree": None}]
# speclab's own arm flags (store/legacy_arms.py and the acceptance stage's extra configurations): unset or empty
# under llama.cpp, whose configurations are engine.arms entries (the plan's arm, {method: recommended} or the
# recommended flag, it runs)
SPECLAB_ARM_KEYS = ("drafters", "k_policies", "policy_drafters", "drafter_ks", "peer", "peer_modes", "best_fixed")

PLAN_PRESETS = ("drafters", "k_policies", "policy_drafters", "prefill")


def _set(value) -> bool:
    """A flag a user set: not null, not false, not an empty list."""
    return value is not None and value is not False and value != []


def check_engine(cfg: DictConfig, parts: list[str]) -> None:
    """Refuse what the job's engine cannot run (ConfigError, one line)."""
    if engine_name(cfg) != LLAMA:
        tie = OmegaConf.select(cfg, "stage.tie_nats")
        if tie is not None and float(tie) != DivergenceStage.tie_nats:
            raise ConfigError(f"stage.tie_nats={tie} is read only under engine=llama_cpp (its divergences' top-2 "
                              "log-probabilities); speclab's loop uses stage.tie_ulps: leave stage.tie_nats out")
        return
    for part in parts:
        if part in LOOP_ONLY:
            raise ConfigError(f"stage part {part} needs speclab's own loop ({LOOP_ONLY[part]}): run stage="
                              f"{cfg.stage.name} with engine=speclab; engine=llama_cpp runs {list(RUNS_ON_LLAMA)}")
    for group, text in chosen(cfg).items():
        if group in ("drafter", "k_policy"):
            default = "drafter=model" if group == "drafter" else "k_policy=fixed"
            raise ConfigError(f"{text} is speclab's own {group.replace('_', ' ')}: under engine=llama_cpp the job "
                              f"keeps {default} and llama.cpp's configurations are engine.arms entries "
                              "(drafter: model or an n-gram type, ks, settings)")
    stage = cfg.stage
    arms = OmegaConf.to_container(stage.arms, resolve=True) if "arms" in stage else []
    other = [a for a in arms if a != DEFAULT_ARMS[0] and a != {**DEFAULT_ARMS[0], "method": "recommended"}]
    if other:
        raise ConfigError(f"stage.arms entry {other[0]} is speclab's: llama.cpp's arms are engine.arms (e.g. "
                          "engine.arms=[{},{drafter:ngram-simple,default:true}]); under engine=llama_cpp stage.arms "
                          "takes only its default and {method:recommended}")
    # stage=plan presets speclab's drafters and prefills (conf/stage/plan.yaml): its llama.cpp form settles them
    skipped = PLAN_PRESETS if "plan" in parts else ()
    for key in SPECLAB_ARM_KEYS:
        if key in stage and _set(stage[key]) and key not in skipped:
            value = stage[key]
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            raise ConfigError(f"stage.{key}={value} configures speclab's own loop: under engine=llama_cpp leave it "
                              "out; llama.cpp's configurations are engine.arms entries")
    if "trees" in stage and _set(stage.trees):
        raise ConfigError(f"stage.trees={list(stage.trees)} are speclab's token trees: llama.cpp drafts chains; leave "
                          "stage.trees out under engine=llama_cpp")
    if "timing" in parts:
        if "prefill" in stage and stage.prefill and "prefill" not in skipped:
            raise ConfigError("stage.prefill=true times speclab's prefill of the prompt: under engine=llama_cpp "
                              "timing measures passes after a cached prompt only; leave stage.prefill=false")
        if "tree_nodes" in stage and _set(stage.tree_nodes):
            raise ConfigError(f"stage.tree_nodes={list(stage.tree_nodes)} times a tree's 4D-mask pass, which "
                              "llama.cpp does not run: leave stage.tree_nodes out under engine=llama_cpp")
    tie_ulps = OmegaConf.select(cfg, "stage.tie_ulps")
    if tie_ulps is not None and int(tie_ulps) != DivergenceStage.tie_ulps:
        raise ConfigError(f"stage.tie_ulps={tie_ulps} counts units in the last place of speclab's torch logits: "
                          "under engine=llama_cpp a near-tie is read from its top-2 log-probabilities: set "
                          "stage.tie_nats instead")


def on_llama(ctx) -> bool:
    """Whether llama.cpp runs this job's requests (its stages then ask ``ctx.runner``, never the pair's models)."""
    from pipeline.engines.llama_runner import LlamaRunner
    return isinstance(ctx.runner, LlamaRunner)
