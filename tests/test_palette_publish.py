"""One colour per kind in the PNGs and the DVC templates (analysis.palette), the DVC templates' fields, the
decomposition figure's titles, and `make publish` logging the analysis run (described by the answer) into an
empty store, as on a fresh clone."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from analysis import breakeven, fit, time_model  # noqa: E402
from analysis.common import speedup_panels  # noqa: E402
from analysis.palette import KIND_COLORS, MODEL_COLORS, kind_color, vega_scale  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "analysis" / "plot_templates"
KINDS = ["code", "prose", "structured"]


def _color_encodings(node):
    if isinstance(node, dict):
        if "color" in node and isinstance(node["color"], dict) and "field" in node["color"]:
            yield node["color"]
        for v in node.values():
            yield from _color_encodings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _color_encodings(v)


def test_every_template_colours_kinds_as_the_pngs_do():
    for path in TEMPLATES.glob("*.json"):
        spec = json.loads(path.read_text())
        colors = list(_color_encodings(spec))
        assert colors, path.name
        for c in colors:
            assert c["scale"] == vega_scale(), path.name
    scale = vega_scale()
    assert dict(zip(scale["domain"], scale["range"])) == {**KIND_COLORS, **MODEL_COLORS}
    assert len(set(scale["range"])) == len(scale["range"])  # one colour, one kind


def _table() -> pd.DataFrame:
    return pd.DataFrame([{"pair": "p", "kind": kd, "k": k, "alpha": 0.5 + 0.1 * i, "tokens_per_pass": 1 + k * 0.5,
                          "formula_iid": 1 + k * 0.6, "iterations": 10}
                         for i, kd in enumerate(KINDS) for k in (1, 2, 4)])


def test_png_figures_use_the_palette():
    # "all" first: seaborn's default colours would give it code's blue
    both = pd.concat([_table().assign(kind="all").head(3), _table()], ignore_index=True)
    fig = fit.alpha_figure(both)
    lines = {l.get_label(): to_hex(l.get_color()) for l in fig.axes[0].get_legend().get_lines()}
    assert {kd: lines[kd] for kd in ["all", *KINDS]} == {kd: KIND_COLORS[kd] for kd in ["all", *KINDS]}
    plt.close(fig)
    fig = fit.tokens_figure(_table())
    drawn = {to_hex(l.get_color()) for l in fig.axes[0].get_lines()}
    assert {KIND_COLORS[kd] for kd in KINDS} <= drawn
    plt.close(fig)
    points = pd.DataFrame([{"pair": "p", "kind": kd, "k": k, "measured": 1.1, "measured_lo": 1.0, "measured_hi": 1.2,
                            "predicted_iid": 1.2, "predicted_empirical": 1.15, "alpha": 0.8}
                           for kd in KINDS for k in (1, 2)])
    fig = speedup_panels(points, KINDS, lambda ax, g: None, "t")
    for ax, kd in zip(fig.axes, KINDS):
        assert to_hex(ax.get_lines()[0].get_color()) == KIND_COLORS[kd]  # the measured line
        assert to_hex(ax.title.get_color()) == KIND_COLORS[kd]
    plt.close(fig)
    costs = pd.DataFrame([{"pair": "p", "pass_len": n, "c_draft": 0.3, "c_verify": 1.2} for n in range(1, 12)])
    kinds = ["code", "prose", "rag"]  # rag: not the third colour of matplotlib's default cycle
    fig = breakeven.map_figure(costs, points.assign(kind=points.kind.replace({"structured": "rag"})), ["p"], 11, 10)
    dots = {l.get_label().split(":")[0]: to_hex(l.get_color()) for l in fig.axes[0].get_lines()
            if ":" in l.get_label()}
    assert dots == {kd: KIND_COLORS[kd] for kd in kinds}
    plt.close(fig)
    assert kind_color("a kind nobody listed") not in KIND_COLORS.values()


def test_decomposition_titles_do_not_overlap():
    rows = [{"kind": kd, "k": k, "source": s, **{c: 1.0 for c in time_model.DECOMP_PARTS}}
            for kd in KINDS for k in range(1, 9) for s in ("predicted", "measured")]
    fig = time_model.decomposition_figure(pd.DataFrame(rows))
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == len(KINDS)
    boxes = [ax.title.get_window_extent() for ax in panels]
    for a, b in zip(boxes, boxes[1:]):
        assert a.x1 < b.x0, "subplot titles overlap"
    for ax, box in zip(panels, boxes):  # each title within its own panel
        frame = ax.get_window_extent()
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1
    plt.close(fig)


def test_dvc_plot_files_name_kind_and_predictor():
    plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]
    templates = {pid: p for e in plots if isinstance(e, dict) for pid, p in e.items()}
    assert templates["speedup_by_k"]["template"].endswith("speedup_intervals.json")
    spec = json.loads((TEMPLATES / "speedup_intervals.json").read_text())
    fields = json.dumps(spec)
    assert '"measured_lo"' in fields and '"measured_hi"' in fields and '"y2"' in fields
    header = (REPO / "outputs" / "metrics" / "plots" / "speed_points.csv").read_text().splitlines()[0].split(",")
    assert {"measured_lo", "measured_hi"} <= set(header)
    for name in ("speed_predictions.csv", "time_model_predictions.csv"):
        df = pd.read_csv(REPO / "outputs" / "metrics" / "plots" / name)
        assert {"kind", "predictor", "series"} <= set(df.columns), name
        assert df.predictor.notna().all() and set(df.kind) <= set(KIND_COLORS)


@pytest.mark.slow
def test_make_publish_logs_the_analysis_run_with_the_answer(tmp_path):
    import mlflow

    from analysis.answer import read_answer, render_text
    from analysis.publish import publish
    from test_analysis_mlflow import params_for

    uri = f"sqlite:///{tmp_path / 'fresh.db'}"  # an empty store, as a fresh clone has
    params = params_for(uri)
    run_id = publish(params)
    assert run_id
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.run_name == f"analysis-{params['campaign']}" and run.info.status == "FINISHED"
    description = run.data.tags["mlflow.note.content"]
    assert description == render_text(read_answer(REPO / "outputs" / "analysis"))
    assert description.startswith("# The answer")
    make = (REPO / "Makefile").read_text()
    assert "\npublish: setup\n\t$(BIN)/python -m analysis.publish\n" in make
    assert "make publish" in (REPO / "README.md").read_text()
