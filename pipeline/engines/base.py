"""The engine seam: what every engine answers (speclab's own loop, llama.cpp's server, the next one), so that a stage
runs on any of them without knowing which. A stage asks ``engine_of(ctx)`` and calls only the methods below.

An engine is one class (``Engine``), the ``_target_`` of its ``conf/engine/<name>.yaml``, built by Hydra's
``instantiate`` with that file's keys (a constructor that only stores its settings: nothing starts before
``context``). It answers

- ``context(cfg, prompts)``: start a configuration: load or start what it runs, make the prompts' token ids
  (``StageContext``, with ``runner`` this engine); ``close()`` stops it;
- ``request(ctx, arm, ids, ...)``: one request of token ids -> ``RequestResult``: the tokens, the wall time and
  its split into prompt and decode, the engine's counters (drafted, accepted, the target's passes, accepted per
  draft position where the engine counts them), the top-n probabilities of each new token where it gives them;
- ``run(ctx, arm, ids, gen)``: the speed stage's run of one arm -> ``RunResult`` (tokens, wall, prompt time and
  the row's loop columns, ``loop_columns`` of a request by default);
- ``time_passes(ctx, prompt_id, ids)``: its own passes after a prompt (the target's over 1..9 new tokens and the
  draft's) -> ``TimedPass`` list; ``step_times`` / ``block_step_times``: its target step, draft step and checks;
- ``top_probs(ids, n, batch)``: the target's top-n probabilities of the next token (None: not given);
- ``memory(ctx)``, ``model_sizes(ctx)``, ``weights(cfg)``, ``draft_name(cfg)``: the rows' columns about it;
- ``check(cfg, parts)`` (a classmethod, before anything loads): refuse what it cannot run, one line;
- ``serve_load(ctx, arm, inputs, concurrency)``: the load stage's closed loop of ``concurrency`` concurrent requests
  (a server's slots or batch; speclab's loop: waves of one batch) -> ``LoadRun``, ``LoadRefused`` (one line) where it
  cannot serve that load; ``load_switch(arm, up_to)``: its own setting that speculates up to that many concurrent
  requests and not above (None: it has none).

What an engine lacks it declares (``stage_parts``, ``counts_iterations``, ``recomputes_logits``, ``top_probs``
returning None), never a stage testing its name. Stored rows name their engine (``engine`` column): a summary that
needs to know how those rows were counted asks ``engine_class(name)``.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from omegaconf import DictConfig

from pipeline.config.engine_conf import DEFAULT
from pipeline.engines.closed_loop import LoadRun, closed_loop
from pipeline.config.schema import ENGINES as ENGINE_CONFS
from speclab.measures.step_costs import PassTiming
from speclab.specs.arms import Arm

DEFAULT_ENGINE = DEFAULT  # the engine of a config composed without the engine group, and of rows written before it
# Each engine's class by the name its rows carry (``engine`` column): how a summary of stored rows asks what the
# engine that wrote them counted. Read from the engine group's schema (its ``_target_`` default): declared once there.
ENGINES = {name: conf._target_ for name, conf in ENGINE_CONFS.items()}
# One-token step times taken in each block just before its runs (stage.block_timing_repeats > 0; NaN
# otherwise): the machine's state at the time of the runs, for a time model priced at that state.
BLOCK_STEP_FIELDS = ["block_target_step_s", "block_draft_step_s"]
ITERATION_TIMES = ("draft", "verify", "rollback", "bookkeeping")


class LoadRefused(ValueError):
    """A load an engine cannot serve as configured, said in one line (what, and the setting that would allow it)."""

    one_line = True


@dataclass
class RequestResult:
    """One request, as the engine counts it."""

    tokens: list[int]
    wall_s: float                 # request sent to answer read (prompt included: the user's latency)
    prompt_s: float               # the engine's time on the prompt (NaN where it does not say)
    decode_s: float               # the engine's time generating after it
    drafted: int = 0              # proposals the drafter made
    accepted: int = 0             # of which the target kept
    passes: int | None = None     # the target's passes after the prompt's (vLLM counts these); None: one per token
                                  # not accepted, which counts the prompt's pass that made the first token
    accepted_per_pos: list[int] | None = None  # per draft position 0, 1, ...: proposals accepted there (None: not counted)
    top_probs: list[list[tuple[int, float]]] | None = None  # per new token: (id, p), best first (None: not asked/given)
    loop: dict[str, Any] | None = None  # an engine's own loop columns of a speed row (None: ``loop_columns``)

    @property
    def iterations(self) -> int:
        """Target passes (``passes``, else every token not accepted: each pass yields one token of its own beside the
        accepted ones, the prompt's pass included). Read accepted counts from ``accepted``, not from tokens - passes."""
        return self.passes if self.passes is not None else max(len(self.tokens) - self.accepted, 0)


class RunResult(NamedTuple):
    """The speed stage's run of one arm on one prompt."""

    tokens: list[int]
    wall_s: float
    prompt_s: float
    loop: dict[str, Any]  # the speed row's loop columns (acceptance_rate, tokens_per_pass, iterations, ...)


class StepTimes(NamedTuple):
    """Target step, draft step (NaN without a draft) and the check of k proposals (a pass over k + 1), per k."""

    target_step_s: float
    draft_step_s: float
    verify_s: dict[int, float]


@dataclass
class TimedPass:
    """One timed pass length of one model after one context: a row of the timing stage."""

    context_len: int          # tokens before the pass (0: a prefill of pass_len prompt tokens)
    model: str                # target, draft, target_tree (a tree's 4D-mask check)
    timing: PassTiming        # pass_len, median_s, q25_s, q75_s, samples
    memory: dict[str, Any]    # where the weights were while it was timed (the MEMORY_FIELDS columns)


@dataclass
class AcceptanceRun:
    """One configuration's run on one prompt for the acceptance stage: a request, or (an engine that counts each
    iteration of its loop) the loop's per-iteration columns."""

    prompt: Any                           # the Prompt (id, kind)
    arm: dict[str, Any]                   # k, k_policy, drafter columns (``Arm.columns``)
    result: RequestResult | None = None   # a request's counters: one row
    iterations: list[dict[str, Any]] | None = None  # the loop's rows' own columns, one per iteration
    prompt_len: int = 0


@dataclass
class SamplerDraws:
    """The token after one context, drawn through an engine's own speculative sampling (the distribution stage's rows
    of that engine's rule): each draw one request whose first verify step checked a proposal at that context."""

    rule: str                     # the rows' rule: the engine's sampler and configuration (``vllm ngram k=4``)
    counts: Any                   # numpy array over the vocabulary: draws of each token
    q: Any = None                 # the proposal distribution its drafter had there (torch [V]), where known
    requests: int = 0             # requests sent (draws kept: the ones whose earlier tokens matched the context)


def by_position(counts: list[int] | None) -> str:
    """Counts per draft position as the rows' comma-separated column ('' where the engine does not count them)."""
    return ",".join(str(int(c)) for c in counts) if counts else ""


def loop_columns(r: RequestResult, spec: bool) -> dict[str, Any]:
    """A speed row's loop columns from a request's counters: acceptance = accepted / drafted; iterations = target
    passes after the prompt; accepted per draft position where the engine counts them. An engine that does not time
    its iterations' parts leaves their times empty (NaN)."""
    n = len(r.tokens)
    iters = r.iterations if spec else n
    nan = float("nan")
    return {"acceptance_rate": r.accepted / r.drafted if spec and r.drafted else nan,
            "tokens_per_pass": n / iters if iters else nan, "iterations": iters,
            "mean_k": r.drafted / iters if spec and iters else nan, "merged_prefill": False, "tree_nodes": 0.0,
            "checked_by_depth": "", "accepted_by_depth": by_position(r.accepted_per_pos),
            "draft_calls_by_width": "", "passes_by_width": "",
            "loop_new_tokens": n, **{f"{p}_s_per_iter": nan for p in ITERATION_TIMES}}


class Engine:
    """What a stage asks the engine that runs a job (see the module's docstring). Subclasses implement the methods
    that raise NotImplementedError; the rest have defaults an engine of requests can keep."""

    name: str = "engine"
    # The arm entries a job runs where stage.arms is null (speclab/specs/arms.py ArmEntry's keys): its own choice.
    default_arms: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    # Stage parts it runs (None: every one); check_engine refuses the others before anything loads.
    stage_parts: ClassVar[tuple[str, ...] | None] = None
    # Whether its acceptance rows are one per iteration of its loop (else one per request: alpha = accepted/drafted).
    counts_iterations: ClassVar[bool] = False
    # Whether ``ctx.pair`` holds its target in torch: a divergence is then explained by recomputing the logits
    # three ways (ulps); else from the engine's own top-2 probabilities (``top_probs``, nats).
    recomputes_logits: ClassVar[bool] = False

    # -- before anything loads ----------------------------------------------------------------------------------------
    @classmethod
    def check(cls, cfg: DictConfig, parts: list[str]) -> None:
        """Refuse an option this engine cannot run (ConfigError, one line). The parts are checked by check_engine."""

    @classmethod
    def arm_text(cls, arm: Arm) -> str | None:
        """How a user writes this configuration for the engine (a plan's recommendation); None: speclab's words."""
        return None

    # -- a configuration ---------------------------------------------------------------------------------------------
    def context(self, cfg: DictConfig, prompts):
        """Start a configuration: what it runs loaded or started, the prompts' token ids made (StageContext whose
        ``runner`` is this engine)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop what ``context`` started."""

    def compute_threads(self) -> int | None:
        """The threads its timed work runs on, where not torch's in this process (the load check discounts them)."""
        return None

    def weights(self, cfg: DictConfig) -> str:
        """The weights as this engine runs them (the rows' ``dtype``)."""
        return str(cfg.pair.dtype)

    def draft_name(self, cfg: DictConfig) -> str:
        """The draft model as the rows name it (``draft``)."""
        return str(cfg.pair.draft)

    # -- requests ----------------------------------------------------------------------------------------------------
    def arms(self, ctx, ks: list[int]) -> list[Arm]:
        """Plain, then the configurations a job compares (the speed stage's arms; the acceptance stage's speculative
        ones)."""
        raise NotImplementedError

    def speculative_arm(self, ctx, k: int) -> Arm:
        """The job's speculative configuration at k (what divergence compares with plain decoding)."""
        return Arm("speculative", k, str(ctx.cfg.k_policy.name), str(ctx.cfg.drafter.name), self.name)

    def warm_arms(self, arms: list[Arm]) -> list[Arm]:
        """The arms the speed stage runs once on one prompt before it times any."""
        return list(arms)

    def prepare(self, ctx, arms: list[Arm]) -> None:
        """Whatever the arms need measured before any run (speclab: an adaptive policy's price table)."""

    def request(self, ctx, arm: Arm, ids, gen=None, n_probs: int = 0, greedy: bool = False) -> RequestResult:
        """One request of ``arm`` for ``cfg.max_new_tokens`` tokens after ``ids`` (1 x n token ids): sampled as the
        job's ``sampling`` (``gen`` its seeds) unless ``greedy``; ``n_probs`` > 0 asks each new token's top
        probabilities (an engine that cannot leaves ``top_probs`` None)."""
        raise NotImplementedError

    def run(self, ctx, arm: Arm, ids, gen) -> RunResult:
        r = self.request(ctx, arm, ids, gen)
        return RunResult(r.tokens, r.wall_s, r.prompt_s,
                         r.loop if r.loop is not None else loop_columns(r, arm.method != "plain"))

    def acceptance_runs(self, ctx, prompts: list, ks: list[int], gen) -> Iterable[AcceptanceRun]:
        """The acceptance stage's runs: by default one request per speculative arm (``arms``) and prompt."""
        from tqdm import tqdm
        for arm in [a for a in self.arms(ctx, ks) if a.method == "speculative"]:
            for prompt in tqdm(prompts, desc=f"acceptance {self.name} {arm.label}", leave=False):
                ids = ctx.inputs[prompt.id]
                yield AcceptanceRun(prompt, arm.columns(), self.request(ctx, arm, ids, gen), prompt_len=ids.shape[1])

    def sampler_draws(self, ctx, context, runs: int, sampling, seed: int) -> list[SamplerDraws]:
        """The token after ``context`` (speclab.measures.contexts.Context) drawn about ``runs`` times through the
        engine's own speculative sampling, per speculative configuration (the distribution stage tests each against
        the target's distribution). Empty: the engine samples through speclab's rules, which the stage draws."""
        return []

    def top_probs(self, ids: list[int], n_probs: int, batch: int = 0) -> list[tuple[int, float]] | None:
        """The target's top-``n_probs`` probabilities of the token after ``ids`` (best first), from one pass over its
        last ``batch`` tokens after the rest cached (0: one pass over all); None where the engine cannot give them."""
        return None

    # -- a load of concurrent requests ------------------------------------------------------------------------------
    def prepare_load(self, ctx, arm: Arm, concurrency: int) -> None:
        """Start (from the job's main thread) and warm what serves ``concurrency`` concurrent requests of ``arm``;
        ``LoadRefused`` (one line) where the engine cannot."""
        what = "plain decoding" if arm.method == "plain" else arm.label
        raise LoadRefused(f"engine {self.name} cannot serve concurrent requests (load {concurrency} of {what})")

    def load_request(self, ctx, arm: Arm, ids, concurrency: int) -> RequestResult:
        """One request of a load (called from several threads at once, after ``prepare_load``)."""
        raise LoadRefused(f"engine {self.name} cannot serve concurrent requests")

    def serve_load(self, ctx, arm: Arm, inputs: list, concurrency: int) -> LoadRun:
        """``inputs`` (token ids, in order) sent by ``concurrency`` closed-loop clients; each Sent's ``measured`` is
        the request's RequestResult."""
        self.prepare_load(ctx, arm, concurrency)
        return closed_loop(lambda i: self.load_request(ctx, arm, inputs[i], concurrency), len(inputs), concurrency)

    @classmethod
    def load_switch(cls, arm: Arm, up_to: int) -> str | None:
        """The engine's own setting that speculates with ``arm`` up to ``up_to`` concurrent requests and decodes
        plainly above (None: it has none)."""
        return None

    # -- costs -------------------------------------------------------------------------------------------------------
    def time_passes(self, ctx, prompt_id: str, ids) -> list[TimedPass]:
        """The timing stage's passes after one prompt (``stage.pass_lengths`` after it and ``context_extra`` more
        tokens, ``repeats`` and ``warmup``), the target's then the draft's."""
        raise NotImplementedError

    def step_times(self, ctx, ks: list[int], progress: str | None = None) -> StepTimes:
        """Target step, draft step and check of k proposals, on the job's first prompt (the speed stage's drift
        check, taken before and after its runs)."""
        raise NotImplementedError

    def block_step_times(self, ctx, ids) -> dict[str, float]:
        """BLOCK_STEP_FIELDS timed now after this prompt (NaN when ``stage.block_timing_repeats`` is 0)."""
        return dict.fromkeys(BLOCK_STEP_FIELDS, float("nan"))

    def memory(self, ctx) -> dict[str, Any]:
        """The MEMORY_FIELDS columns: where the weights are, how much memory they take."""
        raise NotImplementedError

    def model_sizes(self, ctx) -> dict[str, Any]:
        """The timing rows' size columns: {target,draft}_{params,bytes,layers} (None where unknown)."""
        return {f"{role}_{what}": None for role in ("target", "draft") for what in ("params", "bytes", "layers")}


def engine_of(ctx) -> Engine:
    """The engine that runs this job (speclab's own loop where the context was built without one)."""
    runner = getattr(ctx, "runner", None)
    return engine_class(DEFAULT_ENGINE)() if runner is None else runner


def engine_class(name: str | None) -> type[Engine]:
    """The class of the engine whose rows carry ``name`` (``Engine`` for a name not in ``ENGINES``)."""
    path = ENGINES.get(str(name or DEFAULT_ENGINE))
    if path is None:
        return Engine
    import importlib
    module, _, cls = path.rpartition(".")
    return getattr(importlib.import_module(module), cls)


def rows_engine(df) -> str:
    """The engine that wrote these rows (one per file; files written before the column: speclab's)."""
    return str(df.engine.iloc[0]) if "engine" in df and len(df) else DEFAULT_ENGINE


__all__ = ["BLOCK_STEP_FIELDS", "DEFAULT_ENGINE", "ENGINES", "AcceptanceRun", "Engine", "LoadRefused", "LoadRun",
           "RequestResult", "RunResult",
           "SamplerDraws", "StepTimes", "TimedPass", "engine_class", "engine_of", "loop_columns", "rows_engine"]
