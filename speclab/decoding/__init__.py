"""The speculative step and its loops: plain and speculative generation (one row and a ragged batch), the parts the
step calls (drafters, k policies, acceptance rules, sampling), the KV caches and their rollback, input checks and
honest timing. May import speclab.costs, speclab.stats and speclab.specs; nothing above.
"""
