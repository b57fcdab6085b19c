"""Reading stage outputs, parameters, and writing deterministic figures, tables, metrics and plot data."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from pandas.api.types import is_bool_dtype, is_numeric_dtype  # noqa: E402

from analysis.inputs import AnalysisError, campaign_dir, read_stage_files  # noqa: E402
from analysis.palette import kind_color  # noqa: E402
from speclab.stats.intervals import bootstrap_interval, median_ci  # noqa: E402
from store import layout  # noqa: E402
from store.compat import with_defaults  # noqa: E402
from store.files import atomic_write  # noqa: E402
from store.manifest import campaign_problem, published_campaigns  # noqa: E402


def load_params(path: str | Path = "params.yaml") -> dict:
    """The parameters as DVC sees them (``dvc.api.params_show()``: the workspace's params.yaml).

    Outside a DVC repository (the tests run the scripts in a temporary folder holding only a
    params.yaml) DVC has nothing to show, and the file is read directly.
    """
    if Path(path) == Path("params.yaml") and Path("dvc.yaml").is_file():
        try:
            import dvc.api

            params = dvc.api.params_show(repo=".")
            if params:
                return params
        except Exception:  # noqa: BLE001 - any DVC problem: the file itself says the same
            pass
    return yaml.safe_load(Path(path).read_text())


def published_campaign(params: dict) -> str:
    """The campaign `dvc repro` publishes (params.yaml: campaign); dvc.yaml's deps name the same folder."""
    campaign = params.get("campaign")
    campaign_dir(params["outputs_dir"], campaign)  # validates the name
    return campaign


def check_published(outputs_dir: str | Path, campaign: str | None = None) -> None:
    """AnalysisError, one line naming the file, when a published campaign under ``outputs_dir`` (``campaign``, or
    every one) is not exactly as published: a file listed in its manifest missing or changed, a file not
    listed, or its manifest missing or not the one sealed (``store.manifest``)."""
    try:
        names = [campaign] if campaign is not None else published_campaigns(outputs_dir)
    except layout.StoreError as err:
        raise AnalysisError(str(err)) from None
    for name in names:
        if problem := campaign_problem(campaign_dir(outputs_dir, name)):
            raise AnalysisError(problem)


def read_stage(outputs_dir: str | Path, stage: str, campaign: str) -> pd.DataFrame:
    """Every finished Parquet file of a stage in ``campaign``, checked, concatenated, with a campaign column.

    Only that campaign's folder is read, so results of other campaigns (ad-hoc ``scratch`` runs)
    never reach the published tables. Files are read one by one rather than as a dataset so that
    a file written with a newer schema keeps its extra columns instead of inheriting the first
    file's schema. A bad file, or a published campaign that has changed, raises ``AnalysisError`` before
    anything is pooled.
    """
    check_published(outputs_dir, campaign)
    return _pooled(outputs_dir, stage, campaign)


def _pooled(outputs_dir: str | Path, stage: str, campaign: str) -> pd.DataFrame:
    files = read_stage_files(outputs_dir, campaign, stage)
    if not files:
        return pd.DataFrame()
    df = with_defaults(pd.concat([f.data for f in files], ignore_index=True))
    return df.assign(campaign=campaign)


def read_stage_if_any(outputs_dir: str | Path, stage: str, campaign: str) -> pd.DataFrame:
    """``read_stage``, or an empty frame where the campaign holds no file of the stage (a section of a campaign
    still being measured, or absent, says "not measured" instead of stopping)."""
    check_published(outputs_dir, campaign)
    if not layout.stage_paths(outputs_dir, campaign, stage):
        return pd.DataFrame()
    return _pooled(outputs_dir, stage, campaign)


def bootstrap_settings(params: dict) -> dict:
    """params.yaml's ``bootstrap:`` as the keyword arguments of ``bootstrap_ci`` (samples, seed, level)."""
    b = params["bootstrap"]
    return {"samples": int(b["samples"]), "seed": int(b["seed"]), "level": float(b["level"])}


def bootstrap_ci(values: np.ndarray, stat=np.median, samples: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """The interval of ``stat`` the analysis reports: for the median, the distribution-free order-statistic
    interval (``speclab.stats.intervals.median_ci``; NaN, no interval, below ``runs_needed(level)`` runs), which holds its
    level at every number of runs where a percentile bootstrap of the median covers about half the time at two
    runs; for another statistic (a mean), the percentile bootstrap (``speclab.stats.intervals.bootstrap_interval``). The
    interval a job logs as ``speedup_lo``/``speedup_hi`` is the one the analysis reports."""
    if stat is np.median:
        return median_ci(values, level)
    return bootstrap_interval(values, stat, level, samples, seed)


def read_table(analysis_dir: str | Path, name: str) -> pd.DataFrame:
    """An analysis table by name (empty when its stage has not produced it; AnalysisError when unreadable)."""
    path = Path(analysis_dir) / f"{name}.parquet"
    if not path.exists():
        return pd.DataFrame()
    try:
        return pd.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - any reader error means the same thing here
        raise AnalysisError(f"{path} is not a readable Parquet file ({type(err).__name__})") from None


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """PNG without timestamps or software tags in its metadata, so reruns are byte-identical."""
    out = atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight",
                                                     metadata={"Software": None}, format="png"))
    plt.close(fig)
    return out


# Saved floats keep this many significant digits: sums and fits can differ in the last bits from run to run
# (thread counts, BLAS), and rounded they are the same bytes, so `dvc repro --force` with unchanged inputs
# changes nothing. Far beyond any digit the report shows.
SIGNIFICANT = 12


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}")


def rounded(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its float columns at ``SIGNIFICANT`` digits (NaN and infinities as they are)."""
    out = df.copy()
    for column in (c for c in df.columns if df[c].dtype.kind == "f"):
        out[column] = df[column].map(_round).astype(df[column].dtype)
    return out


def _rounded_data(data):
    """Nested dicts and lists with every float at ``SIGNIFICANT`` digits."""
    if isinstance(data, float):
        return _round(data)
    if isinstance(data, dict):
        return {k: _rounded_data(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_rounded_data(v) for v in data]
    return data


def save_table(df: pd.DataFrame, path: str | Path) -> Path:
    """A small result table as Parquet (the report renders it as Markdown), floats rounded (``SIGNIFICANT``)."""
    table = rounded(df)
    return atomic_write(path, lambda tmp: table.to_parquet(tmp, index=False))


def _params_outputs_dir() -> str | None:
    """params.yaml's ``outputs_dir`` where it reads (the script's own reading of it says what is wrong otherwise)."""
    try:
        params = yaml.safe_load(Path("params.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return str(params["outputs_dir"]) if isinstance(params, dict) and params.get("outputs_dir") else None


def run_script(name: str, main: Callable[[], None]) -> None:
    """Run a script's main; bad input ends it with one line on stderr and exit code 1, no traceback.

    Each main reads and checks all its inputs before it writes anything, so such an exit
    leaves every committed output as it was. First, every published campaign under params.yaml's
    ``outputs_dir`` is checked against its manifest and seal (``check_published``): a script that reads
    stage files through any path then reads only campaigns exactly as they were published.
    """
    try:
        if outputs_dir := _params_outputs_dir():
            check_published(outputs_dir)
        main()
    except AnalysisError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        sys.exit(1)


def markdown_table(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A table as Markdown (``DataFrame.to_markdown``, i.e. tabulate's pipe format); missing values are blank.

    Text columns are never parsed as numbers (a config hash like ``12345e67`` stays as written).
    """
    if df.empty:
        return "_no rows_\n"
    text = [i for i, c in enumerate(df.columns) if is_bool_dtype(df[c]) or not is_numeric_dtype(df[c])]
    shown = df.astype(object).where(df.notna(), None)
    return shown.to_markdown(index=False, floatfmt=floatfmt, missingval="", disable_numparse=text) + "\n"


def save_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Plot data for ``dvc plots`` as CSV (6 significant digits, so reruns and diffs stay readable)."""
    return atomic_write(path, lambda tmp: df.to_csv(tmp, index=False, float_format="%.6g", lineterminator="\n"))


def save_json(data: dict, path: str | Path) -> Path:
    """A metrics file for ``dvc metrics`` (keys in the order given, floats rounded: stable across reruns)."""
    text = json.dumps(_rounded_data(data), indent=2, allow_nan=False) + "\n"
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def speedup_panels(points: pd.DataFrame, kinds: list[str], draw: Callable, title: str, legend_size: int = 7):
    """One panel per kind: the measured speed-up (median, 95% CI) against k, plain decoding at 1, and
    whatever ``draw(ax, rows_of_the_kind)`` adds (the predictors)."""
    fig, axes = plt.subplots(1, len(kinds), figsize=(4 * len(kinds), 3.8), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        g = points[points.kind == kind].sort_values("k")
        ax.errorbar(g.k, g.measured, yerr=[g.measured - g.measured_lo, g.measured_hi - g.measured],
                    fmt="o-", label="measured (median, 95% CI)", capsize=3, color=kind_color(kind))
        draw(ax, g)
        ax.axhline(1.0, color="grey", lw=1)
        ax.set(xlabel="k")
        ax.set_title(kind, color=kind_color(kind))
    axes[0][0].set_ylabel("speed-up over adjacent plain run")
    axes[0][0].legend(fontsize=legend_size)
    fig.suptitle(title)
    return fig
