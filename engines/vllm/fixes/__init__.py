"""What vLLM's server processes load from PYTHONPATH when a setting asks for it (engines/vllm/conf.py cpu_expand_fix)."""
