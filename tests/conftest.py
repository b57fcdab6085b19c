import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import pytest  # noqa: E402
import torch  # noqa: E402

# One torch thread by default (SPECLAB_TEST_THREADS=N asks for N): the tests' models are tiny, and a second
# OpenMP thread only spins against whatever else runs on a shared 2-core machine: the modules without the
# one_torch_thread fixture below ran up to 10x slower under load (test_loop_greedy 2 s -> 21 s,
# test_acceptance_replay 3 s -> 35 s). A test that needs more threads sets them itself (test_trust's). make mutation
# runs every test in one thread too (mutmut forks its workers, and a forked OpenMP pool can deadlock).
torch.set_num_threads(int(os.environ.get("SPECLAB_TEST_THREADS", 0)) or 1)


@pytest.fixture(scope="session")
def tiny_pair():
    """Target and an unrelated (useless) draft over a 64-token vocabulary."""
    from speclab.models.loading import tiny_random_model

    return tiny_random_model(64, seed=0), tiny_random_model(64, seed=1)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: a second torch thread only adds contention on a shared 2-core machine (10x slower
    under load); the previous setting comes back after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_addoption(parser):
    parser.addoption("--qwen", action="store_true",
                     help="run the tests marked qwen (the Qwen2.5-Coder pair: minutes each; make test-qwen)")


LLAMA_MISSING = "no llama.cpp build (make llama-cpp builds it into the speclab cache)"
LLAMA_REQUIRED = pytest.StashKey[bool]()


def pytest_collection_modifyitems(config, items):
    _llama_cpp_items(items)
    # The Qwen pair's tests load 2.4 GB of weights and decode at a few tokens a second: they run on
    # request (make test-qwen), not in make test.
    if config.getoption("--qwen"):
        return
    skip = pytest.mark.skip(reason="the Qwen pair's tests run with --qwen (make test-qwen)")
    for item in items:
        if "qwen" in item.keywords:
            item.add_marker(skip)


def _llama_cpp_items(items) -> None:
    """Tests marked llama_cpp need the build of `make llama-cpp`: without it they are skipped, or, where
    SPECLAB_REQUIRE_LLAMA=1 (CI, which builds it first), they fail, so a broken build cannot pass as skips."""
    marked = [item for item in items if item.get_closest_marker("llama_cpp")]
    if not marked:
        return
    from engines.llama_cpp.build import installed

    if installed() is not None:
        return
    required = os.environ.get("SPECLAB_REQUIRE_LLAMA") == "1"
    for item in marked:
        if required:
            item.stash[LLAMA_REQUIRED] = True
        else:
            item.add_marker(pytest.mark.skip(reason=LLAMA_MISSING))


def pytest_runtest_setup(item):
    if item.stash.get(LLAMA_REQUIRED, False):
        pytest.fail(f"SPECLAB_REQUIRE_LLAMA=1 and {LLAMA_MISSING}", pytrace=False)


@pytest.fixture(scope="session")
def memo_import_graph():
    """analysis.import_graph.named_imports remembered per (file, root, text) for the session: the import-graph
    tests walk the same ~200 unchanged repository files thousands of times (every stage, every dvc.yaml variant),
    and parsing them again each time was most of a minute. The function still runs once on every distinct file text
    (a test that rewrites a file gets a fresh parse); its result depends on the file's text and on which module
    files exist under root, and no test adds or removes a module file after it first reads a root's graph."""
    import analysis.import_graph as graph

    real = graph.named_imports
    seen: dict[tuple, frozenset] = {}

    def named_imports(path, root=graph.ROOT):
        key = (str(path), str(root), path.read_text())
        if key not in seen:
            seen[key] = frozenset(real(path, root))
        return set(seen[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graph, "named_imports", named_imports)
        yield
