"""Tree shapes as config: ``stage.trees`` lists specs such as ``static:3-2-1-1``, ``dynamic:5-4-16``, ``lookup:4-6``.

A spec is a family (speclab.trees.tree_drafters) and, after a colon, its numbers joined by ``-`` in the order
of ``FAMILIES[family].numbers``; without numbers the class's defaults. One job may compare several shapes
of one family (the speed stage runs each as an arm in the same rotated blocks as the chains and plain
decoding), which is why a shape is a short spec rather than a config group option. A tree arm's
``drafter`` column is ``tree:<spec>`` with every number written out, so the same shape always has one name.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "tree:"


@dataclass(frozen=True)
class Family:
    """A tree family: its class (imported only when a drafter is built or a default is read, so that the
    analysis can name and parse tree arms without torch)."""

    path: str
    numbers: tuple[str, ...]  # the constructor arguments a spec's numbers fill, in order
    listed: bool = False  # the numbers are one list argument (static: the branching per depth)
    uses_model: bool = True

    @property
    def cls(self) -> type:
        module, _, name = self.path.rpartition(".")
        return getattr(importlib.import_module(module), name)

    def default(self, param: str) -> Any:
        # speclab.drafting.strategy.default_of's one line, not imported: the analysis reads specs without speclab's torch side
        return inspect.signature(self.cls).parameters[param].default


FAMILIES = {
    "static": Family("speclab.trees.tree_drafters.StaticTreeDrafter", ("branching",), listed=True),
    "dynamic": Family("speclab.trees.tree_drafters.DynamicTreeDrafter", ("depth", "topk", "nodes")),
    "lookup": Family("speclab.trees.tree_drafters.LookupTreeDrafter", ("branches", "depth"), uses_model=False),
}
EXAMPLES = "static:3-2-1-1, dynamic:5-4-16 (depth-topk-nodes), lookup:4-6 (branches-depth)"


@dataclass(frozen=True)
class TreeSpec:
    family: str
    args: dict

    @property
    def label(self) -> str:
        fam = FAMILIES[self.family]
        nums = self.args["branching"] if fam.listed else [self.args[n] for n in fam.numbers]
        return f"{self.family}:{'-'.join(str(n) for n in nums)}"

    @property
    def drafter(self) -> str:
        """The arm's ``drafter`` column."""
        return PREFIX + self.label

    @property
    def nodes(self) -> int:
        """The nodes of a full tree of this shape (0 for lookup trees, whose size follows the text)."""
        if self.family == "static":
            total, width = 0, 1
            for b in self.args["branching"]:
                width *= b
                total += width
            return total
        return int(self.args["nodes"]) if self.family == "dynamic" else 0

    @property
    def depth(self) -> int:
        return len(self.args["branching"]) if self.family == "static" else int(self.args["depth"])

    @property
    def children_asked(self) -> int:
        """The most candidates one node asks of the draft's vocabulary (0 for lookup trees: they copy text)."""
        if self.family == "static":
            return max(self.args["branching"])
        return int(self.args["topk"]) if self.family == "dynamic" else 0

    def size(self, vocab: int, max_depth: int, context: int) -> "TreeSize":
        """The largest tree of this shape one iteration can build: a draft of ``vocab`` tokens, at most
        ``max_depth`` deep (the job's token budget), after ``context`` tokens (lookup trees: at most one
        branch per earlier position). Counts saturate at ``CAP`` (a size no machine holds)."""
        depth = max(0, min(self.depth, max_depth))
        if self.family == "lookup":
            branches = min(int(self.args["branches"]), max(context, 1))
            return TreeSize(min(branches * depth, CAP), 0, 0, 0)
        if self.family == "static":
            widths, width = [], 1
            for b in self.args["branching"][:depth]:
                width = min(width * min(b, vocab), CAP)
                widths.append(width)
            fed = widths[:-1]
            return TreeSize(min(sum(widths), CAP), min(sum(fed), CAP), max(fed, default=0), len(fed))
        topk, t = int(self.args["topk"]), min(int(self.args["topk"]), vocab)
        # Level d holds the frontier's children (frontier x t); the next frontier is the level's topk best, fed
        # to the draft for level d + 1. Once the frontier stops changing every later level is the same.
        candidates = fed = widest = d = 0
        frontier = 1  # the root
        while d < depth:
            level = frontier * t
            candidates, d = candidates + level, d + 1
            if d == depth:
                break
            nxt = min(topk, level)
            fed, widest = fed + nxt, max(widest, nxt)
            if nxt == frontier:
                rest = depth - d
                candidates, fed = candidates + rest * level, fed + (rest - 1) * nxt
                break
            frontier = nxt
        candidates = min(candidates, CAP)
        return TreeSize(min(int(self.args["nodes"]), candidates), min(fed, CAP), widest, max(depth - 1, 0),
                        candidates)


CAP = 10**15


@dataclass(frozen=True)
class TreeSize:
    """One iteration's tree at its largest: the ``nodes`` the target verifies; the nodes the draft model is fed
    (``draft_fed`` in all, ``draft_widest`` in its widest call, over ``draft_levels`` calls after the catch-up);
    ``candidates``: what a dynamic tree scores before keeping its ``nodes`` best."""

    nodes: int
    draft_fed: int
    draft_widest: int
    draft_levels: int
    candidates: int = 0


def parse_tree(spec: str | Mapping[str, Any]) -> TreeSpec:
    """A tree shape as a family and its arguments; one-line errors. ``spec`` is a short spec (a ``stage.trees``
    entry, a ``tree:`` drafter column) or the same as data: ``{family: static, branching: [3, 2, 1, 1]}``,
    ``{family: dynamic, depth: 5, topk: 4, nodes: 16}`` (a missing number takes the class's default)."""
    if isinstance(spec, Mapping):
        return _tree_from_data(spec)
    text = str(spec).removeprefix(PREFIX)
    family, _, numbers = text.partition(":")
    if family not in FAMILIES:
        raise ValueError(f"tree {spec!r} is not allowed: use one of {sorted(FAMILIES)}, optionally with numbers, e.g. "
                         f"{EXAMPLES}")
    fam = FAMILIES[family]
    try:
        values = [int(x) for x in numbers.split("-")] if numbers else []
    except ValueError:
        values = [0]
    if any(v < 1 for v in values) or (values and not fam.listed and len(values) != len(fam.numbers)):
        raise ValueError(f"tree {spec!r} is not allowed: its numbers are integers >= 1 joined by '-' "
                         f"({'the children per depth' if fam.listed else '-'.join(fam.numbers)}), e.g. {EXAMPLES}")
    if fam.listed:
        args = {"branching": values or list(fam.default("branching"))}
    else:
        args = dict(zip(fam.numbers, values)) if values else {n: fam.default(n) for n in fam.numbers}
    return TreeSpec(family, args)


def is_tree(drafter: str) -> bool:
    return str(drafter).startswith(PREFIX)


def too_many_children(spec: TreeSpec, vocab: int | None) -> str | None:
    """Why ``spec`` cannot be drafted from a vocabulary of ``vocab`` tokens (it asks more candidates per node
    than there are tokens), or None."""
    asked = spec.children_asked
    if vocab is None or asked <= vocab:
        return None
    what = "children per node" if spec.family == "static" else "top-k candidates per node"
    return (f"tree {spec.label} asks {asked:,} {what}, more than the draft's vocabulary of {vocab:,} tokens: "
            f"use at most {vocab:,}")


def make_tree_drafter(spec: TreeSpec, draft_model: Any, ngram: dict | None = None) -> Any:
    """A new tree drafter of this shape; the pair's draft model goes to the families that run one, the job's
    n-gram sizes (``ngram``: max_ngram, min_ngram) to prompt-lookup trees. A shape asking more candidates per
    node than the draft's vocabulary has is refused before the drafter exists."""
    fam = FAMILIES[spec.family]
    if fam.uses_model and (problem := too_many_children(spec, getattr(getattr(draft_model, "config", None),
                                                                      "vocab_size", None))):
        raise ValueError(problem)
    extra = {"model": draft_model} if fam.uses_model else dict(ngram or {})
    return fam.cls(**extra, **spec.args)


def _tree_from_data(data: Mapping[str, Any]) -> TreeSpec:
    family = data.get("family")
    if family not in FAMILIES:
        raise ValueError(f"tree {dict(data)} is not allowed: its family is one of {sorted(FAMILIES)}, e.g. "
                         "{family: static, branching: [3, 2, 1, 1]}")
    fam = FAMILIES[family]
    names = ("branching",) if fam.listed else fam.numbers
    unknown = set(data) - {"family", *names}
    if unknown:
        raise ValueError(f"tree {dict(data)} is not allowed: a {family} tree takes {list(names)}, not {sorted(unknown)}")
    if fam.listed:
        numbers = list(data.get("branching") or fam.default("branching"))
    else:
        numbers = [data.get(n, fam.default(n)) for n in names]
    if not numbers or any(isinstance(v, bool) or not isinstance(v, int) for v in numbers):
        raise ValueError(f"tree {dict(data)} is not allowed: its numbers are integers >= 1 ({', '.join(names)})")
    return parse_tree(f"{family}:{'-'.join(map(str, numbers))}")
