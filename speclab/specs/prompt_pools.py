"""Named pools of prompt kinds: a pool selects its member kinds as one kind (its own table row).

Torch-free, so that the pipeline's prompt loading and the analysis's tables read one definition.
"""
from __future__ import annotations

# Spec-Bench's MT-bench subcategories; ``kinds: [mt_bench]`` selects them as one kind.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
POOLS = {"mt_bench": MT_BENCH}
