"""A battery of seeded calls into the core (loop, batch, acceptance, sampling, drafters, k policies, cost model,
statistics) whose outputs are recorded in ``tests/golden/core_battery.json``.

``tests/test_core_golden.py`` reruns it and compares: any change of an output (a token, an iteration's counts, a
probability to 6 significant digits, a k chosen, a p-value, an error message) fails, so a bug that changes output
cannot pass unnoticed even where no behavioural test states the expected value. The behavioural tests say why an
output is right; this one says that it did not move. After an intended change of output, rewrite the record with

    .venv/bin/python tests/core_battery.py --write

and say in the commit why the outputs moved. One torch thread: the record is exact for a thread count.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

GOLDEN = Path(__file__).parent / "golden" / "core_battery.json"
V = 48


def num(x: Any) -> Any:
    """JSON-safe, rounded to 6 significant digits (floats), recursively."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return [num(v) for v in x.tolist()] if x.ndim else num(x.item())
    if isinstance(x, (list, tuple)):
        return [num(v) for v in x]
    if isinstance(x, dict):
        return {str(k): num(v) for k, v in x.items()}
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(f"{float(x):.6g}") if np.isfinite(x) else str(float(x))
    return x if x is None or isinstance(x, str) else repr(x)


def outcome(fn: Callable[[], Any]) -> Any:
    """The call's output, or its error as ``Type: message`` (bad input is part of the contract)."""
    try:
        return num(fn())
    except Exception as err:  # noqa: BLE001 - every error's text is recorded
        return f"{type(err).__name__}: {err}"


def _iterations(result) -> list:
    return [[s.k, s.accepted, s.bonus, s.new_tokens, s.length, s.draft_fed, s.draft_calls, s.target_fed,
             s.with_prompt, s.checked] for s in result.iterations]


def _sources(drafter) -> list:
    """A hybrid's count of row-iterations each source proposed (reported by the pipeline)."""
    return [getattr(drafter, "lookup_iterations", None), getattr(drafter, "model_iterations", None)]


def _batch_iterations(result) -> list:
    return [[s.rows, s.k, s.accepted, s.checked, s.bonus_rows, s.new_tokens, num(s.masked_share),
             num(s.draft_masked_share), s.dummy_inputs, s.with_prompt] for s in result.iterations]


def _models():
    from speclab.models.loading import tiny_random_model
    from test_batch_greedy import perturbed_copy

    target = tiny_random_model(V, seed=5, logit_scale=3.0)
    return target, perturbed_copy(target, 0.3, 1), perturbed_copy(target, 1.0, 2)


def _sliding() -> torch.nn.Module:
    """A tiny Gemma 3 with a sliding-window layer (window 6)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(21)
    cfg = Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return Gemma3ForCausalLM(cfg).eval()


PROMPTS = [
    [3, 9, 4, 17, 3, 9, 4, 22, 3, 9],  # repeats: lookup matches
    [40, 2, 2, 7],
    [11, 30, 12, 31, 13, 32, 14, 33, 11, 30, 12, 31, 5],
]


def _ids(p: list[int]) -> torch.Tensor:
    return torch.tensor([p])


def _policies() -> dict[str, Callable[[], Any]]:
    from speclab.decoding.k_policy import ConditionedK, CostModelK, FixedK, HeuristicK
    from speclab.costs.time_model import CostTable

    table = CostTable({1: 0.3, 2: 0.35}, {k: 1.0 + 0.08 * k for k in range(1, 9)})
    dear = CostTable({1: 0.9, 2: 1.0}, {k: 1.3 + 0.05 * k for k in range(1, 9)})
    return {
        "fixed3": lambda: 3,
        "heuristic_defaults": lambda: HeuristicK(),
        "cost_defaults": lambda: CostModelK(0.2),
        "heuristic": lambda: HeuristicK(2, k_min=1, k_max=6),
        "cost_chapter": lambda: CostModelK(0.3, 1.1, k_min=1, k_max=6, decay=0.7),
        "cost_chapter_plain": lambda: CostModelK(0.35, 1.3, k_min=0, k_max=6, decay=0.6, probe_every=3),
        "cost_sure": lambda: CostModelK(0.3, 1.1, k_min=1, k_max=6, alpha0=1.0),
        # Priced at the edge of paying: a certain prior pays by 0.03% at k = 1 (alpha 1) and not at alpha 0.999;
        # a useless draft that costs nothing prices k = 1 at exactly 1.0 (plain is not better).
        "cost_edge_sure": lambda: CostModelK(0.8995, 1.1, k_min=0, k_max=1, alpha0=1.0),
        "cost_edge_even": lambda: CostModelK(0.0, 1.0, k_min=0, k_max=1, alpha0=0.0),
        "cost_jagged": lambda: CostModelK(0.25, {k: 1.0 + 0.1 * (k % 3) for k in range(1, 9)}, k_min=1, k_max=8),
        "cost_table_iid": lambda: CostModelK(0.3, k_max=8, table=table, estimator="iid"),
        "cost_table_positions": lambda: CostModelK(0.3, k_min=0, k_max=8, table=table, estimator="positions",
                                                   probe_every=2),
        "cost_dear_plain": lambda: CostModelK(0.9, k_min=0, k_max=8, table=dear, decay=0.5, probe_every=3),
        "by_label": lambda: ConditionedK(lambda label: FixedK(1 + label if isinstance(label, int) else 4)),
        "conditioned": lambda: ConditionedK(lambda label: CostModelK(0.0, table.verify, k_min=0, k_max=8,
                                                                     table=CostTable({1: 0.0, 2: 0.0}, table.verify))),
    }


class OneRowLookup:
    """Prompt lookup through the one-row interface (start/propose/rollback/label): the loop wraps it in OneRow."""

    def __init__(self) -> None:
        from speclab.decoding.drafters import PromptLookupDrafter

        self.inner = PromptLookupDrafter(max_ngram=2)

    def start(self, ids, n_ctx):
        self.inner.start(ids, n_ctx)

    def label(self, ids, length):
        return self.inner.label(ids, length)

    def propose(self, ids, length, k, sampling, generator):
        return self.inner.propose(ids, length, k, sampling, generator)

    def rollback(self, valid_length):
        self.inner.rollback(valid_length)


class OneRowModel:
    """A draft model through the one-row interface, without a cache: each proposal is one uncached pass over the
    sequence so far, arg-max or drawn (then its distribution goes with it); ``start`` keeps the prompt, which
    every proposal must still begin with."""

    def __init__(self, model) -> None:
        self.model = model

    def start(self, ids, n_ctx):
        self.prompt = ids[0, :n_ctx].clone()

    def propose(self, ids, length, k, sampling, generator):
        from speclab.decoding.sampling import logits_to_probs

        seq = ids[0, :length].clone()
        if not torch.equal(seq[: self.prompt.shape[0]], self.prompt):
            raise ValueError("the sequence no longer begins with the prompt")
        props, rows = [], []
        for _ in range(k):
            logits = self.model(seq.view(1, -1)).logits[0, -1]
            if sampling.do_sample:
                p = logits_to_probs(logits, sampling)
                tok = int(torch.multinomial(p, 1, generator=generator))
                rows.append(p)
            else:
                tok = int(torch.argmax(logits))
            props.append(tok)
            seq = torch.cat([seq, seq.new_tensor([tok])])
        q = torch.stack(rows) if rows else None
        return seq.new_tensor(props), q

    def rollback(self, valid_length):
        pass


def _drafters(good, bad) -> dict[str, Callable[[], Any]]:
    from speclab.decoding.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter

    return {
        "one_row_lookup": OneRowLookup,
        "one_row_model": lambda: OneRowModel(good),
        "model_good": lambda: ModelDrafter(good),
        "model_bad": lambda: bad,
        "lookup": lambda: PromptLookupDrafter(),
        "lookup_2_2": lambda: PromptLookupDrafter(max_ngram=2, min_ngram=2),
        "hybrid": lambda: HybridDrafter(good),
        "hybrid_min3": lambda: HybridDrafter(bad, max_ngram=2, min_match=3),
    }


def loop_cases(target, good, bad, part: str) -> dict:
    """One drafter's generations under every k policy (``part`` = its name), or the other loop cases ("misc")."""
    from speclab.decoding.acceptance import accept_sample_resample_target
    from speclab.decoding.loop import plain_generate, speculative_generate
    from speclab.decoding.sampling import SamplingConfig

    out: dict[str, Any] = {}
    hot = SamplingConfig(True, 0.8, top_k=12, top_p=0.9)
    for d_name, make_d in _drafters(good, bad).items():
        if d_name != part:
            continue
        for p_name, make_p in _policies().items():
            for i, prompt in enumerate(PROMPTS[:2]):
                def run(sampling=None, seed=0, **kw):
                    g = torch.Generator().manual_seed(seed) if sampling else None
                    d = make_d()
                    r = speculative_generate(target, d, _ids(prompt), 14, k=make_p(),
                                             sampling=sampling or SamplingConfig(), generator=g, **kw)
                    return [r.tokens, r.prompt_len, _iterations(r), _sources(d)]
                out[f"greedy/{d_name}/{p_name}/{i}"] = outcome(run)
                out[f"sample/{d_name}/{p_name}/{i}"] = outcome(lambda: run(hot, seed=i))
    if part == "misc":
        for j, bad in enumerate([[[3, 9, 4]], torch.tensor([3, 9, 4]), torch.zeros((1, 0), dtype=torch.long),
                                 torch.tensor([[1, 2], [3, 4]]), "3 9 4"]):
            out[f"bad_prompt/{j}"] = outcome(lambda: speculative_generate(target, good, bad, 4).tokens)
            out[f"bad_plain_prompt/{j}"] = outcome(lambda: plain_generate(target, bad, 4).tokens)
    for i, prompt in enumerate(PROMPTS if part == "misc" else []):
        out[f"defaults/{i}"] = outcome(lambda: _iterations(speculative_generate(target, good, _ids(prompt), 11)))
        out[f"greedy_eos/{i}"] = outcome(lambda: _iterations(speculative_generate(
            target, good, _ids(prompt), 20, k=4, eos_token_id=[7, 19])))
        out[f"no_merge/{i}"] = outcome(lambda: _iterations(speculative_generate(
            target, good, _ids(prompt), 9, k=3, merge_prefill=False)))
        out[f"wrong_rule/{i}"] = outcome(lambda: speculative_generate(
            target, bad, _ids(prompt), 12, k=2, sampling=SamplingConfig(True), generator=torch.Generator().manual_seed(3),
            rule=accept_sample_resample_target).tokens)
        for budget in (1, 2, 5):
            out[f"budget{budget}/{i}"] = outcome(lambda: _iterations(speculative_generate(
                target, good, _ids(prompt), budget, k=3)))
        out[f"plain_greedy/{i}"] = outcome(lambda: plain_generate(target, _ids(prompt), 10, eos_token_id=19).tokens)
        out[f"plain_sample/{i}"] = outcome(lambda: plain_generate(
            target, _ids(prompt), 10, hot, generator=torch.Generator().manual_seed(i)).tokens)
    return out


def batch_cases(target, good, bad, part: str) -> dict:
    """One drafter's batched generations (``part`` = its name), or the other batched cases ("misc")."""
    from speclab.decoding.batch import batch_plain_generate, batch_speculative_generate
    from speclab.decoding.batch_cache import sliding_window
    from speclab.decoding.sampling import SamplingConfig

    prompts = [torch.tensor(p) for p in PROMPTS]
    hot = SamplingConfig(True, 1.2, top_p=0.95)
    out: dict[str, Any] = {}
    for d_name, make_d in _drafters(good, bad).items():
        if d_name != part:
            continue
        for p_name in ("fixed3", "cost_table_positions", "conditioned"):
            make_p = _policies()[p_name]
            for compact in (0.25, None):
                def run(sampling=None, **kw):
                    g = torch.Generator().manual_seed(7) if sampling else None
                    d = make_d()
                    r = batch_speculative_generate(target, d, prompts, 12, k=make_p(),
                                                   sampling=sampling or SamplingConfig(), generator=g,
                                                   compact_at=compact, eos_token_id=[19], **kw)
                    return [r.tokens, r.prompt_lens, r.accepted, r.proposed, r.checked, _batch_iterations(r),
                            _sources(d)]
                out[f"greedy/{d_name}/{p_name}/{compact}"] = outcome(run)
                out[f"sample/{d_name}/{p_name}/{compact}"] = outcome(lambda: run(hot))
    if part != "misc":
        return out
    out["sliding_window"] = outcome(lambda: [sliding_window(target), sliding_window(_sliding())])
    out["sliding_batch"] = outcome(lambda: batch_speculative_generate(_sliding(), _sliding(), prompts, 4, k=2).tokens)
    out["sliding_one_row"] = outcome(lambda: batch_speculative_generate(_sliding(), _sliding(), prompts[:1], 12,
                                                                        k=3).tokens)
    for j, bad in enumerate([[], (), prompts[0], [prompts[0], [1, 2]], [prompts[0], torch.zeros(0, dtype=torch.long)],
                             [torch.tensor([[1, 2], [3, 4]])], [prompts[0], torch.tensor([1, 2], device="meta")]]):
        out[f"bad_prompts/{j}"] = outcome(lambda: batch_speculative_generate(target, good, bad, 4).tokens)
        out[f"bad_plain_prompts/{j}"] = outcome(lambda: batch_plain_generate(target, bad, 4).tokens)
    out["prompt_forms"] = outcome(lambda: batch_speculative_generate(target, good, (prompts[0].view(1, -1), prompts[1]),
                                                                     5).tokens)
    out["defaults"] = outcome(lambda: _batch_iterations(batch_speculative_generate(target, good, prompts, 10)))
    out["defaults_plain"] = outcome(lambda: batch_plain_generate(target, prompts, 6).tokens)
    out["no_merge"] = outcome(lambda: _batch_iterations(batch_speculative_generate(
        target, good, prompts, 8, k=2, merge_prefill=False)))
    out["plain_greedy"] = outcome(lambda: batch_plain_generate(target, prompts, 9, eos_token_id=[19]).tokens)
    out["plain_sample"] = outcome(lambda: batch_plain_generate(
        target, prompts, 9, hot, generator=torch.Generator().manual_seed(2)).tokens)
    return out


def rule_cases() -> dict:
    from speclab.decoding import acceptance as A

    g = torch.Generator().manual_seed(11)
    out: dict[str, Any] = {}
    for k in (0, 1, 3, 5):
        p = torch.softmax(torch.randn(k + 1, 9, generator=g) * 2, -1)
        q = torch.softmax(torch.randn(k, 9, generator=g) * 2, -1)
        props = torch.multinomial(q, 1, generator=g).view(-1) if k else torch.empty(0, dtype=torch.long)
        for name, rule in A.SAMPLING_RULES.items():
            gg = torch.Generator().manual_seed(k)
            out[f"{name}/{k}"] = outcome(lambda: [rule(props, p, q, gg) for _ in range(30)])
        logits = torch.log(p)
        out[f"greedy/{k}"] = outcome(lambda: A.accept_greedy(torch.argmax(logits[:k], -1), logits))
        out[f"greedy_miss/{k}"] = outcome(lambda: A.accept_greedy((torch.argmax(logits[:k], -1) + 1) % 9, logits))
    logits = torch.randn(3, 5, 9, generator=g)
    props = torch.argmax(logits[:, :4], -1)
    props[0, 2] = (props[0, 2] + 1) % 9
    props[1, 0] = (props[1, 0] + 1) % 9
    out["batch_greedy"] = outcome(lambda: A.batch_accept_greedy(props, logits))
    out["batch_greedy_counts"] = outcome(lambda: A.batch_accept_greedy(props, logits, torch.tensor([4, 2, 0])))
    # Placement: on the meta device the rules get as far as reading a number back; a tensor made on the CPU
    # instead of the inputs' device fails earlier, with another error (the CPU-only stand-in for a GPU).
    meta = torch.device("meta")
    pm, qm = torch.softmax(torch.randn(3, 9, generator=g), -1).to(meta), torch.softmax(torch.randn(2, 9, generator=g),
                                                                                        -1).to(meta)
    out["placement"] = outcome(lambda: A.accept_sample(torch.tensor([1, 2]).to(meta), pm, qm))
    out["placement_first_token"] = outcome(lambda: A.first_token_draws(pm[0], qm[0], 10, "correct"))
    p, q = torch.softmax(torch.randn(9, generator=g), -1), torch.softmax(torch.randn(9, generator=g), -1)
    out["residual"] = outcome(lambda: A.residual(p, q))
    out["residual_equal"] = outcome(lambda: A.residual(p, p))
    for rule in ("correct", "resample_target", "keep_draft", "nope"):
        out[f"first_token_draws/{rule}"] = outcome(
            lambda: np.bincount(A.first_token_draws(p, q, 2000, rule, torch.Generator().manual_seed(1)), minlength=9))
        out[f"rule_output/{rule}"] = outcome(lambda: A.rule_output_distribution(p, q, rule))
    return out


def sampling_cases() -> dict:
    from speclab.decoding.sampling import SamplingConfig, choose_token, logits_to_probs

    g = torch.Generator().manual_seed(12)
    logits = torch.randn(2, 10, generator=g) * 2
    out: dict[str, Any] = {}
    for t in (0.5, 1.0, 1.7):
        for top_k in (0, 1, 3, 10, 12):
            for top_p in (1.0, 0.9, 0.5, 0.05):
                cfg = SamplingConfig(True, t, top_k, top_p)
                out[f"{t}/{top_k}/{top_p}"] = outcome(lambda: logits_to_probs(logits, cfg))
                out[f"choose/{t}/{top_k}/{top_p}"] = outcome(
                    lambda: [choose_token(logits[0], cfg, torch.Generator().manual_seed(s)) for s in range(6)])
    out["greedy_choice"] = outcome(lambda: choose_token(logits[1], SamplingConfig(), None))
    for bad in [dict(do_sample=True, temperature=0.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5),
                dict(do_sample=False, temperature=0.0)]:
        out[f"bad/{sorted(bad.items())}"] = outcome(lambda: SamplingConfig(**bad))
    return out


def cost_cases() -> dict:
    with np.errstate(all="raise"):  # a warning the model meant to silence becomes an error (and a changed output)
        return _cost_cases()


def _cost_cases() -> dict:
    from speclab.costs import cost_model as C

    out: dict[str, Any] = {}
    out["types"] = [type(C.expected_tokens_per_iteration(0.7, 3)).__name__, type(C.predicted_speedup(0.7, 3, 0.2)).__name__,
                    type(C.expected_tokens_per_iteration(np.array([0.7]), 3)).__name__]
    out["best_k_cap"] = outcome(lambda: [C.best_k(0.99, 0.01), C.best_k(0.999, 0.0, 1.0, 12)])
    alphas = np.array([0.0, 0.3, 0.6, 0.9, 0.99, 1.0])
    for k in (1, 2, 5):
        out[f"tokens/{k}"] = outcome(lambda: C.expected_tokens_per_iteration(alphas, k))
        for cd, cv, oh in [(0.1, 1.0, 0.0), (0.4, 1.3, 0.2), (0.0, 0.8, 0.0), (1.2, 1.0, 0.0)]:
            out[f"speedup/{k}/{cd}/{cv}/{oh}"] = outcome(lambda: C.predicted_speedup(alphas, k, cd, cv, oh))
            out[f"cost/{k}/{cd}/{cv}/{oh}"] = outcome(lambda: C.iteration_cost(k, cd, cv, oh))
            out[f"break_even/{k}/{cd}/{cv}/{oh}"] = outcome(lambda: C.break_even_alpha(k, cd, cv, oh))
    out["scalar"] = outcome(lambda: [C.expected_tokens_per_iteration(0.7, 3), C.predicted_speedup(0.7, 3, 0.2)])
    for a in (0.2, 0.6, 0.95):
        out[f"best_k/{a}"] = outcome(lambda: [C.best_k(a, 0.2), C.best_k(a, 0.05, {k: 1 + 0.1 * k for k in range(1, 9)},
                                                                          k_max=8), C.best_k(a, 0.3, 1.0, 4, 0.5)])
    for bad in [(1.5, 2), (-0.1, 2), (0.5, 0), (0.5, np.array([1, 0]))]:
        out[f"bad/{bad[0]}/{bad[1]}"] = outcome(lambda: C.expected_tokens_per_iteration(*bad))
    out["bad_break_even"] = outcome(lambda: C.break_even_alpha(0, 0.1))
    out["defaults"] = outcome(lambda: [C.break_even_alpha(k, cd) for k in (1, 3, 6) for cd in (0.0, 0.1, 0.3, 1.0)]
                              + [C.predicted_speedup(0.8, 3, 0.2), C.iteration_cost(3, 0.2, 1.1)])
    return out


def stats_cases() -> dict:
    from types import SimpleNamespace

    from speclab.stats import goodness_of_fit, intervals

    S = SimpleNamespace(**{k: v for m in (goodness_of_fit, intervals) for k, v in vars(m).items() if not k.startswith("_")})

    rng = np.random.default_rng(13)
    out: dict[str, Any] = {}
    for i, (n_bins, conc, n) in enumerate([(8, 1.0, 200), (30, 0.3, 400), (5, 5.0, 1000), (70, 0.2, 3000)]):
        p = rng.dirichlet(np.full(n_bins, conc))
        c = rng.multinomial(n, p)
        skew = rng.multinomial(n, rng.dirichlet(np.full(n_bins, conc)))
        out[f"pool/{i}"] = outcome(lambda: S.pool_bins(c, p))
        out[f"pool3/{i}"] = outcome(lambda: S.pool_bins(c, p, 3.0))
        out[f"chi/{i}"] = outcome(lambda: S.chi_square(c, p).__dict__)
        out[f"chi_skew/{i}"] = outcome(lambda: S.chi_square(skew, p).__dict__)
        out[f"top/{i}"] = outcome(lambda: S.chi_square_top(c, p, n_top=4).__dict__)
        out[f"top_default/{i}"] = outcome(lambda: S.chi_square_top(skew, p).__dict__)
    flat = np.full(100, 0.01)  # every bin well filled: n_top decides how many bins are tested
    c_flat = rng.multinomial(20000, flat)
    out["top_flat"] = outcome(lambda: [S.chi_square_top(c_flat, flat).__dict__,
                                       S.chi_square_top(c_flat, flat, 61, 3.0).__dict__,
                                       S.chi_square_top(c_flat * 0 + 1, flat, 5, min_expected=0.5).__dict__])
    # Ties cut by n_top inside a group, in shuffled order: which tied tokens are kept depends on a stable sort.
    wide_ties = np.random.default_rng(5).permutation(np.repeat([0.04, 0.02, 0.01], [10, 15, 15]))
    wide_ties = wide_ties / wide_ties.sum()
    c_ties = rng.multinomial(900, wide_ties)
    out["top_wide_ties"] = outcome(lambda: [S.chi_square_top(c_ties, wide_ties, n_top=18, min_expected=1.0).__dict__,
                                            S.chi_square_top(c_ties.astype(np.int32), wide_ties.tolist(), 30).__dict__])
    out["power_top10"] = outcome(lambda: S.chi_square_power(flat, np.r_[0.02, np.full(98, 0.98 / 98), 0.0], 3000,
                                                            sims=30, n_top=10))
    out["power_defaults"] = outcome(lambda: S.chi_square_power(flat, np.r_[0.02, np.full(98, 0.98 / 98), 0.0], 3000))
    ties = np.array([0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05])
    out["top_ties"] = outcome(lambda: S.chi_square_top(np.array([30, 10, 25, 9, 12, 8, 4, 2]), ties, n_top=4).__dict__)
    out["power"] = outcome(lambda: [S.chi_square_power(np.array([0.3, 0.3, 0.2, 0.2]), np.array([0.4, 0.3, 0.2, 0.1]),
                                                       300, sims=40, n_top=3, seed=2),
                                    S.chi_square_power(np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.4, 0.3, 0.2, 0.1]),
                                                       300, level=0.2, sims=40, seed=3)])
    for i, values in enumerate([[1.2], [1.1, 1.1, 1.1], [0.9, 1.3, 1.1, np.nan, 1.6, 1.0], rng.lognormal(0, 0.3, 25),
                                [1.0, 1.0, 1.0, 2.0], [2.0, 1.0, 1.0, 1.0], rng.lognormal(0, 1.0, 9),
                                [0.5, 0.6, 3.0, 9.0, 0.55, 0.7, 12.0], [1.0, 1.4], rng.lognormal(0, 0.5, 40),
                                np.random.default_rng(99).normal(1.0, 0.2, 8)]):
        out[f"median_interval/{i}"] = outcome(lambda: S.median_ci(np.array(values)))
        out[f"median_interval90/{i}"] = outcome(lambda: S.median_ci(np.array(values), 0.9))
        out[f"median_ci99/{i}"] = outcome(lambda: S.median_ci(np.array(values), 0.99))
    out["median_interval_empty"] = outcome(lambda: S.median_ci(np.array([np.nan])))
    out["runs_needed"] = outcome(lambda: [S.runs_needed(level) for level in (0.5, 0.75, 0.8, 0.9, 0.95, 0.975, 0.99)])
    out["runs_needed_bad"] = outcome(lambda: S.runs_needed(1.0))
    out["median_ci_sizes"] = outcome(lambda: [S.median_ci(np.arange(float(n)), 0.95) for n in (5, 6, 7, 8, 9, 17, 18, 30, 31, 60)])
    # A large sample (101 runs: the order statistics well inside), and the defaults of the bootstrap interval.
    resampled = np.random.default_rng(1).lognormal(0, 0.3, 101)
    out["median_interval_resamples"] = outcome(lambda: S.median_ci(resampled))
    out["bootstrap_interval_defaults"] = outcome(lambda: [S.bootstrap_interval(resampled),
                                                          S.bootstrap_interval(resampled, np.mean)])
    # Pooling at its edges: kept bins tied at the bottom (which one takes the thin tail), a tail exactly at the
    # minimum, every bin thin, two bins, a single observation.
    tied = np.r_[np.full(10, 8.0), np.full(10, 0.3)][np.random.default_rng(0).permutation(20)]
    c_tied = np.random.default_rng(1).multinomial(83, tied / tied.sum())
    out["pool_tied"] = outcome(lambda: [S.pool_bins(c_tied, tied), S.chi_square(c_tied, tied).__dict__])
    halves = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    out["pool_at_minimum"] = outcome(lambda: S.pool_bins(np.array([30, 17, 9, 5, 3]), halves, 8.0))
    out["pool_all_thin"] = outcome(lambda: [S.pool_bins(np.array([1, 2, 1]), np.ones(3) / 3),
                                            S.chi_square(np.array([1, 2, 1]), np.ones(3) / 3).__dict__])
    out["chi_two_bins"] = outcome(lambda: S.chi_square(np.array([30, 70]), np.array([0.5, 0.5])).__dict__)
    out["chi_one_observation"] = outcome(lambda: S.chi_square(np.array([1, 0, 0]), np.ones(3) / 3).__dict__)
    out["bad_zero"] = outcome(lambda: S.chi_square(np.zeros(3), np.ones(3) / 3))
    out["bad_shape"] = outcome(lambda: S.chi_square(np.ones(3), np.ones(4) / 4))
    return out


def policy_cases() -> dict:
    from speclab.decoding.k_policy import CostModelK, FixedK, HeuristicK, RowPolicies, as_count, as_policy

    out: dict[str, Any] = {}
    # Mixed evidence, then a long run of fully accepted iterations (the estimates approach 1: their caps matter).
    trace = [(3, 3), (4, 1), (0, 0), (2, 0), (0, 0), (0, 0), (5, 5), (6, 6), (6, 2), (0, 0), (1, 1), (3, 0)] + [(8, 8)] * 40
    for name, make in _policies().items():
        def run():
            p = as_policy(make())
            p.start()
            ks = []
            for i, (prop, acc) in enumerate(trace):
                if hasattr(p, "condition"):
                    p.condition(i % 3)
                ks.append(p.k)
                p.update(min(prop, p.k) if prop else 0, min(acc, prop, p.k))
            extra = [p.alpha, p.acc, p.chk, p.pos_acc, p.pos_chk, p.survival()] if hasattr(p, "survival") else []
            return [ks, extra]
        out[name] = outcome(run)
    out["rows"] = outcome(lambda: _row_policies(RowPolicies, HeuristicK))
    for value in (3, np.int64(2), torch.tensor(4), 0, -1, 2.0, True, "3", None):
        out[f"as_count/{value!r}"] = outcome(lambda: as_count(value))
        out[f"fixed/{value!r}"] = outcome(lambda: FixedK(value).k)
    out["as_count_min0"] = outcome(lambda: [as_count(0, "k_min", minimum=0), as_count(-1, "k_min", minimum=0)])
    for kw in [dict(k_start=0), dict(k_start=3, k_min=4), dict(k_start=9, k_max=8), dict(k_start=2, k_min=0),
               dict(k_start=2, k_min=2), dict(k_start=5, k_max=5), dict(k_start=1, k_min=1, k_max=1)]:
        out[f"heuristic_bad/{sorted(kw.items())}"] = outcome(lambda: HeuristicK(**kw).k)
    for kw in [dict(estimator="x"), dict(decay=1.0), dict(decay=-0.1), dict(k_min=3, k_max=2), dict(c_draft=-1.0),
               dict(probe_every=0), dict(k_min=-1), dict(k_max=0), dict(k_max=2.5), dict(decay=0.0),
               dict(k_min=3, k_max=3)]:
        out[f"cost_bad/{sorted(kw.items())}"] = outcome(lambda: CostModelK(**{"c_draft": 0.3, **kw}).k)
    return out


def _row_policies(RowPolicies, HeuristicK):
    rows = RowPolicies(HeuristicK(2, k_min=1, k_max=6), 3)
    seen = [rows.ks(None)]
    rows.update([2, 2, 2], [2, 0, 1])
    seen.append(rows.ks(None))
    rows.select([2, 0])
    rows.update([4, 3], [4, 3])
    seen.append(rows.ks(None))
    return seen


def lookup_cases() -> dict:
    from speclab.decoding import drafters as D

    out: dict[str, Any] = {}
    g = torch.Generator().manual_seed(14)
    seqs = [torch.randint(0, 5, (n,), generator=g) for n in (1, 2, 6, 15, 30)]
    seqs.append(torch.tensor([7, 1, 2, 3, 4, 5, 9, 1, 2, 3, 8, 6, 1, 2, 3]))
    seqs.append(torch.tensor([1, 2, 3, 4, 9, 9, 5, 2, 3, 4, 8, 7, 1, 2, 3, 4]))  # 4-gram and 3-gram matches differ
    seqs.append(torch.tensor([6, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]))
    seqs += [torch.tensor([5, 5, 5, 5]), torch.tensor([2, 2, 2]), torch.tensor([4, 4])]  # the longest n-gram possible
    for i, s in enumerate(seqs):
        for mx, mn in [(3, 1), (2, 2), (4, 1), (1, 1)]:
            out[f"hits/{i}/{mx}/{mn}"] = outcome(lambda: D.lookup_hits(s, mx, mn))
            out[f"match/{i}/{mx}/{mn}"] = outcome(lambda: D.lookup_match(s, mx, mn))
            out[f"cont/{i}/{mx}/{mn}"] = outcome(lambda: D.lookup_continuation(s, 4, mx, mn))
        out[f"defaults/{i}"] = outcome(lambda: [D.lookup_hits(s), D.lookup_match(s), D.lookup_continuation(s, 3)])
        out[f"lookup_label/{i}"] = outcome(lambda: [D.PromptLookupDrafter().label(s.view(1, -1), s.shape[0]),
                                                    D.PromptLookupDrafter(4, 2).label(s.view(1, -1), s.shape[0])])
        out[f"hybrid_label/{i}"] = outcome(lambda: [D.HybridDrafter(None).label(s.view(1, -1), s.shape[0]),
                                                    D.HybridDrafter(None, 3, 2).label(s.view(1, -1), s.shape[0]),
                                                    D.HybridDrafter(None, 2, 1, 2).label(s.view(1, -1), s.shape[0])])
    out["bad_lookup"] = outcome(lambda: D.PromptLookupDrafter(1, 2))
    out["bad_lookup0"] = outcome(lambda: D.PromptLookupDrafter(0, 0))
    out["bad_hybrid"] = outcome(lambda: D.HybridDrafter(None, min_match=0))
    return out


def tree_cases() -> dict:
    """Tree generations (static, dynamic, lookup; greedy and sampled): tokens, every iteration's counts and each
    tree's size, so that a mutant changing what a tree arm measures fails here even where the output holds."""
    from speclab.decoding.sampling import SamplingConfig
    from speclab.trees.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter
    from speclab.trees.tree_loop import tree_generate

    target, good, _ = _models()
    hot = SamplingConfig(True, 0.8, top_k=12, top_p=0.9)
    makers = {"static": lambda: StaticTreeDrafter(good, [3, 2, 1, 1]),
              "dynamic": lambda: DynamicTreeDrafter(good, depth=4, topk=3, nodes=10),
              "lookup": lambda: LookupTreeDrafter(max_ngram=3, min_ngram=1, branches=4, depth=5)}
    out: dict[str, Any] = {}
    for name, make in makers.items():
        for i, prompt in enumerate(PROMPTS[:2]):
            for mode, sampling in (("greedy", SamplingConfig()), ("sample", hot)):
                def run(make=make, prompt=prompt, sampling=sampling, i=i):
                    g = torch.Generator().manual_seed(i) if sampling.do_sample else None
                    r = tree_generate(target, make(), _ids(prompt), 14, sampling=sampling, generator=g)
                    return [r.tokens, _iterations(r), [s.tree_nodes for s in r.iterations]]
                out[f"{mode}/{name}/{i}"] = outcome(run)
    return out


# Small sections (one drafter's generations each): a mutant fails the first one it changes, and mutmut runs
# only the sections that reach its function.
PARTS = ["one_row_lookup", "one_row_model", "model_good", "model_bad", "lookup", "lookup_2_2", "hybrid", "hybrid_min3",
         "misc"]
SECTIONS: dict[str, Callable[[], dict]] = {
    **{f"loop/{p}": (lambda p=p: loop_cases(*_models(), p)) for p in PARTS},
    **{f"batch/{p}": (lambda p=p: batch_cases(*_models(), p)) for p in PARTS},
    "rules": rule_cases, "sampling": sampling_cases, "cost": cost_cases, "stats": stats_cases,
    "policies": policy_cases, "lookup": lookup_cases, "trees": tree_cases,
}


def run_section(name: str) -> dict:
    """One section's outputs, computed with one torch thread (JSON-normalised, as recorded)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return json.loads(json.dumps(SECTIONS[name]()))
    finally:
        torch.set_num_threads(before)


def run_battery() -> dict:
    return {name: run_section(name) for name in SECTIONS}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/core_battery.py --write   (rewrites tests/golden/core_battery.json)")
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(run_battery(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
