"""llama.cpp as an engine: its build from the pinned sdist, one llama-server per configuration (started on 127.0.0.1,
stopped on every exit path), asked for token ids and its own timings, and its speculative settings as speclab arms
and back as the flags a user pastes.
"""
