"""transformers' own generate(), plain and assisted, timed the same way as our loops: the peer baseline."""
from __future__ import annotations

import copy
import time

import torch

from speclab.decoding.sampling import GREEDY, SamplingConfig
from speclab.decoding.timing import synchronize


PEER_MODES = ("matched", "default", "lookup")


def hf_generate(target: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                assistant: torch.nn.Module | None = None, k: int = 4, sampling: SamplingConfig = GREEDY,
                eos_token_id: int | list[int] | None = None, mode: str = "matched") -> tuple[list[int], float]:
    """New tokens and synchronised wall seconds of ``target.generate``.

    ``mode`` (with ``assistant``): ``matched`` is assisted generation with a constant schedule of k
    proposals and the confidence threshold off, i.e. the same algorithm as our loop with fixed k;
    ``default`` is assisted generation with the library's own settings (what a user of
    ``generate(assistant_model=...)`` gets). ``lookup`` is transformers' prompt lookup
    (``prompt_lookup_num_tokens=k``, no assistant).
    """
    if mode not in PEER_MODES:
        raise ValueError(f"peer mode {mode!r} is not allowed: use one of {list(PEER_MODES)}")
    gc = copy.deepcopy(target.generation_config)
    gc.update(do_sample=sampling.do_sample, max_new_tokens=max_new_tokens, min_new_tokens=None,
              eos_token_id=eos_token_id)
    if sampling.do_sample:
        # top_k=0 and top_p=1.0 switch those filters off (a model's generation config may set others).
        gc.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    kwargs = {}
    if mode == "lookup":
        gc.update(prompt_lookup_num_tokens=k)
    elif assistant is not None:
        kwargs["assistant_model"] = assistant
    # The library adapts its schedule and threshold on the assistant's own generation config during a
    # call, and that state would carry into the next call: every call starts from the same settings.
    saved = copy.deepcopy(assistant.generation_config) if assistant is not None else None
    if assistant is not None and mode == "matched":
        # The candidate generator reads k, its schedule and the confidence threshold from the assistant's
        # generation config, not from the one passed to generate(): set them there.
        assistant.generation_config.update(num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                                           assistant_confidence_threshold=0.0)
    try:
        synchronize(input_ids.device)
        t0 = time.perf_counter()
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=gc, **kwargs)
        synchronize(input_ids.device)
        wall = time.perf_counter() - t0
    finally:
        if saved is not None:
            assistant.generation_config = saved
    return out[0, input_ids.shape[1]:].tolist(), wall
