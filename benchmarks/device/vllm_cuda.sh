#!/usr/bin/env bash
# The vLLM engine on a GPU, for a session lent one (the `device` tool runs this from the repository root; its machine
# reaches no package registry, so it uses a vLLM already installed there, or the python given as VLLM_PYTHON).
# Checks, each one line: vLLM imports with CUDA; the main job runs with engine=vllm device=cuda on the default pair
# (its draft model and n-gram arms, acceptance and speed, per-request counters); greedy speculation equals vLLM's
# plain output (divergence); and no vLLM process outlives the job. Results and logs under $OUT (or /tmp/vllm-cuda).
set -u
OUT="${OUT:-/tmp/vllm-cuda}"
mkdir -p "$OUT"
PY="${VLLM_PYTHON:-$(command -v python3)}"
if ! "$PY" -c "import vllm, torch; assert torch.cuda.is_available(); print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" > "$OUT/versions.txt" 2>&1; then
  echo "vllm_cuda: no vLLM with CUDA in $PY ($(tail -1 "$OUT/versions.txt")): install the vllm package there or set VLLM_PYTHON" >&2
  exit 1
fi
cat "$OUT/versions.txt"
SPECLAB="${SPECLAB_PYTHON:-.venv/bin/python}"
[ -x "$SPECLAB" ] || { python3 -m venv .venv && .venv/bin/pip install -q -e . && SPECLAB=.venv/bin/python; }
common=(engine=vllm device=cuda "engine.python=$PY" pair=smollm2_int8 prompts.per_kind=1 max_new_tokens=32
        mlflow.enabled=false "outputs_dir=$OUT/outputs" campaign=cuda)
rc=0
"$SPECLAB" -m pipeline.run "${common[@]}" > "$OUT/main.log" 2>&1 || { echo "vllm_cuda: main job failed: $(grep 'speclab: error' "$OUT/main.log" | tail -1)" >&2; rc=1; }
"$SPECLAB" -m pipeline.run "${common[@]}" stage=divergence stage.ks=[2,4] > "$OUT/divergence.log" 2>&1 || { echo "vllm_cuda: divergence failed" >&2; rc=1; }
grep -E "^\[(acceptance|speed|divergence)\]" "$OUT"/*.log | tail -30
if pgrep -f "vllm.entrypoints.openai.api_server" > /dev/null || pgrep -f "VLLM::" > /dev/null; then
  echo "vllm_cuda: a vLLM process outlived its job" >&2; rc=1
fi
exit $rc
