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


# Tests that need an engine's build or environment, by marker: (what says it is there, the variable that makes its
# absence a failure, what is missing). Without it they are skipped, or, where the variable is 1 (CI, which builds
# and installs them first), they fail, so a broken build cannot pass as skips.
def _llama_installed() -> bool:
    from engines.llama_cpp.build import installed
    return installed() is not None


def _vllm_installed() -> bool:
    from engines.vllm.install import installed
    return installed() is not None


ENGINE_MARKERS = {
    "llama_cpp": (_llama_installed, "SPECLAB_REQUIRE_LLAMA",
                  "no llama.cpp build (make llama-cpp builds it into the speclab cache)"),
    "vllm": (_vllm_installed, "SPECLAB_REQUIRE_VLLM",
             "no vLLM environment (make vllm installs it into the speclab cache)"),
}
LLAMA_MISSING = ENGINE_MARKERS["llama_cpp"][2]
REQUIRED_MISSING = pytest.StashKey[str]()


def pytest_collection_modifyitems(config, items):
    _engine_items(items)
    # The Qwen pair's tests load 2.4 GB of weights and decode at a few tokens a second: they run on
    # request (make test-qwen), not in make test.
    if config.getoption("--qwen"):
        return
    skip = pytest.mark.skip(reason="the Qwen pair's tests run with --qwen (make test-qwen)")
    for item in items:
        if "qwen" in item.keywords:
            item.add_marker(skip)


def _engine_items(items) -> None:
    for marker, (present, variable, missing) in ENGINE_MARKERS.items():
        marked = [item for item in items if item.get_closest_marker(marker)]
        if not marked or present():
            continue
        required = os.environ.get(variable) == "1"
        for item in marked:
            if required:
                item.stash[REQUIRED_MISSING] = f"{variable}=1 and {missing}"
            else:
                item.add_marker(pytest.mark.skip(reason=missing))


def pytest_runtest_setup(item):
    missing = item.stash.get(REQUIRED_MISSING, "")
    if missing:
        pytest.fail(missing, pytrace=False)


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
