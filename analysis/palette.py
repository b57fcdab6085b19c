"""One colour per prompt kind (and per model) in every figure: the PNGs (matplotlib/seaborn) and the DVC plot
templates (analysis/plot_templates/*.json, whose ``scale.domain``/``scale.range`` are these mappings; a test keeps
them equal). Predictor lines use colours no kind has."""
from __future__ import annotations

KIND_COLORS = {"all": "#4d4d4d", "code": "#1f77b4", "prose": "#ff7f0e", "structured": "#2ca02c",
               "mt_bench": "#9467bd", "math_reasoning": "#8c564b", "rag": "#e377c2"}
MODEL_COLORS = {"target": "#d62728", "draft": "#17becf"}
OTHER = "#7f7f7f"  # a kind not listed
PREDICTOR_COLORS = ("#000000", "#a0a0a0", "#bcbd22", "#8c6d31")


def kind_color(kind: str) -> str:
    return KIND_COLORS.get(kind, OTHER)


def kind_palette(kinds) -> dict[str, str]:
    """seaborn's ``palette=`` for these kinds."""
    return {k: kind_color(k) for k in kinds}


def vega_scale() -> dict:
    """The colour scale of the Vega-Lite templates: every kind, then the models."""
    colors = {**KIND_COLORS, **MODEL_COLORS}
    return {"domain": list(colors), "range": list(colors.values())}
