"""vLLM as an engine: its own environment from a hash-pinned lock (install.py), one OpenAI-compatible server per
configuration started on 127.0.0.1 and stopped on every exit path (server.py), asked for token ids, its per-request
counters and timings (client.py), its speculative methods as speclab arms and back as the speculative_config a user
pastes (arms.py, torch-free: the analysis reads it), its settings (conf.py) and its runner, the seam's ``Engine``
(runner.py).
"""
