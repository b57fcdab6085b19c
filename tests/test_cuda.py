"""The same exactness checks on a GPU (skipped where torch sees none, as on CI)."""
import pytest
import torch

from speclab.decoding.loop import plain_greedy, speculative_generate
from speclab.models.loading import tiny_random_model
from speclab.decoding.sampling import SamplingConfig
from speclab.decoding.timing import memory_placement

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_exact_on_cuda(dtype):
    dev = torch.device("cuda")
    target = tiny_random_model(64, seed=0).to(dev, dtype)
    draft = tiny_random_model(64, seed=1).to(dev, dtype)
    ids = torch.tensor([[3, 17, 9, 41, 2]], device=dev)
    for k in (1, 4):
        assert speculative_generate(target, draft, ids, 30, k=k).tokens == plain_greedy(target, ids, 30).tokens
    assert memory_placement([target, draft], dev).trusted


def test_sampling_runs_on_cuda_with_device_generator():
    dev = torch.device("cuda")
    target, draft = tiny_random_model(8, seed=10, logit_scale=4.0).to(dev), tiny_random_model(8, seed=11).to(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    out = speculative_generate(target, draft, torch.tensor([[3, 1, 4]], device=dev), 10, k=3,
                               sampling=SamplingConfig(True, 0.7, top_p=0.9), generator=g)
    assert len(out.tokens) == 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_greedy_and_sampling_on_cuda(dtype):
    from speclab.trees.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter
    from speclab.trees.tree_loop import tree_generate

    dev = torch.device("cuda")
    target = tiny_random_model(64, seed=0).to(dev, dtype)
    draft = tiny_random_model(64, seed=1).to(dev, dtype)
    ids = torch.tensor([[3, 17, 9, 41, 2, 3, 17]], device=dev)
    plain = plain_greedy(target, ids, 30).tokens
    for drafter in (StaticTreeDrafter(draft, [3, 2, 1]), DynamicTreeDrafter(draft, 3, 2, 6), LookupTreeDrafter()):
        out = tree_generate(target, drafter, ids, 30).tokens
        # bf16: the tree pass's kernels may break a near-tie another way than the one-token step's
        assert out == plain if dtype == torch.float32 else len(out) == 30
    g = torch.Generator(device=dev).manual_seed(0)
    out = tree_generate(target, StaticTreeDrafter(draft, [2, 2]), ids, 10, sampling=SamplingConfig(True, 0.7, top_p=0.9),
                        generator=g)
    assert len(out.tokens) == 10
