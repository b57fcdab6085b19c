"""A job's tree drafter: the shape from its arm, the n-gram sizes of prompt-lookup trees from the job's drafter."""
from __future__ import annotations

from typing import Any

from speclab.specs.tree_shapes import make_tree_drafter, parse_tree


def job_tree_drafter(cfg: Any, drafter: str, draft_model: Any) -> Any:
    """The tree drafter of a ``tree:`` arm in a job: prompt-lookup trees take the job drafter's n-gram sizes."""
    ngram = {key: int(cfg.drafter[key]) for key in ("max_ngram", "min_ngram") if key in cfg.drafter}
    return make_tree_drafter(parse_tree(drafter), draft_model, ngram)
