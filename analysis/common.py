"""Reading stage outputs, parameters, and writing deterministic figures and tables."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

STAGE_NAMES = ("timing", "acceptance", "speed", "divergence", "distribution")


def load_params(path: str | Path = "params.yaml") -> dict:
    return yaml.safe_load(Path(path).read_text())


def read_stage(outputs_dir: str | Path, stage: str) -> pd.DataFrame:
    """Every finished Parquet file of a stage, concatenated (temp files of running jobs are skipped).

    Files are read one by one rather than as a dataset so that a file written with a newer
    schema keeps its extra columns instead of inheriting the first file's schema.
    """
    if stage not in STAGE_NAMES:
        raise ValueError(f"unknown stage {stage!r}: allowed are {list(STAGE_NAMES)}")
    files = sorted(p for p in (Path(outputs_dir) / stage).glob("*.parquet") if not p.name.startswith("."))
    if not files:
        return pd.DataFrame()
    return with_defaults(pd.concat([pd.read_parquet(f) for f in files], ignore_index=True))


# Columns added to a stage's schema after results were already stored, with the value they had then.
LATER_COLUMNS = {"drafter": "model", "k_policy": "fixed", "context_mode": "prompt", "top_p": 1.0, "top_k": 0}


def with_defaults(df: pd.DataFrame) -> pd.DataFrame:
    """Fill columns that older result files lack, so old and new runs pool correctly."""
    for col, value in LATER_COLUMNS.items():
        if col not in df:
            df[col] = value
        else:
            df[col] = df[col].fillna(value)
    if "drafter" in df and "arm" in df:
        df.loc[df.arm == "plain", ["drafter", "k_policy"]] = "none"
    return df


def bootstrap_ci(values: np.ndarray, stat=np.median, samples: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` (fixed seed: the same data give the same interval)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(samples, len(values)))
    stats = np.apply_along_axis(stat, 1, values[idx])
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def read_table(analysis_dir: str | Path, name: str) -> pd.DataFrame:
    """An analysis table by name (empty when its stage has not produced it)."""
    path = Path(analysis_dir) / f"{name}.parquet"
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def _atomic(path: Path, write) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """PNG without timestamps or software tags in its metadata, so reruns are byte-identical."""
    out = _atomic(Path(path), lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight",
                                                      metadata={"Software": None}, format="png"))
    plt.close(fig)
    return out


def save_table(df: pd.DataFrame, path: str | Path) -> Path:
    """A small result table as Parquet (the report renders it as Markdown)."""
    return _atomic(Path(path), lambda tmp: df.to_parquet(tmp, index=False))


def markdown_table(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    if df.empty:
        return "_no rows_\n"
    cols = list(df.columns)

    def fmt(v):
        if isinstance(v, (float, np.floating)):
            return "" if np.isnan(v) else format(v, floatfmt)
        return str(v)

    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"
