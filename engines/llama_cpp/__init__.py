"""llama.cpp as an engine: its build from the pinned sdist (build.py), one llama-server per configuration started on
127.0.0.1 and stopped on every exit path (server.py), asked for token ids and its own timings (client.py), its
speculative settings as speclab arms and back as the flags a user pastes (arms.py, torch-free: the analysis reads
it), its settings (conf.py) and its runner, the seam's ``Engine`` (runner.py).
"""
