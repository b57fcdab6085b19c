"""MLflow logging for a stage run. A run that cannot be logged still keeps its Parquet."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

PACKAGES = ("torch", "transformers", "speclab", "mlflow", "hydra-core", "numpy", "scipy")


def flatten(cfg: DictConfig) -> dict[str, Any]:
    """Dotted keys of the resolved config (hydra's own section excluded)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            out[prefix] = node

    walk("", {k: v for k, v in container.items() if k != "hydra"})
    return out


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment_tags(device: str, dtype: str) -> dict[str, str]:
    tags = {"git_commit": git_commit(), "device": device, "dtype": dtype, "host": platform.node(),
            "python": sys.version.split()[0]}
    for pkg in PACKAGES:
        try:
            tags[f"version.{pkg}"] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return tags


def ensure_tracking_store(uri: str) -> None:
    """Create the tracking database once (parallel jobs on a brand-new sqlite file race on its schema)."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.MlflowClient(uri).search_experiments(max_results=1)


class CreateTrackingStore(Callback):
    """Hydra callback: before a multirun launches its jobs, create the MLflow store in this process."""

    def __init__(self, uri: str, enabled: bool = True) -> None:
        self.uri, self.enabled = uri, enabled

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.enabled:
            try:
                ensure_tracking_store(self.uri)
            except Exception as err:  # noqa: BLE001 - tracking is optional; the jobs still write Parquet
                print(f"speclab: MLflow store {self.uri} not created ({err}); runs will not be logged",
                      file=sys.stderr)


def log_stage_run(cfg: DictConfig, stage: str, metrics: dict[str, float], artifacts: list[Path],
                  tags: dict[str, str]) -> bool:
    """Log one run: params = flattened config, metrics, tags, artifacts. False (and a message) if it fails."""
    if not cfg.mlflow.enabled:
        return False
    try:
        import mlflow

        mlflow.set_tracking_uri(cfg.mlflow.tracking_uri)
        mlflow.set_experiment(cfg.mlflow.experiment)
        params = {k: ("" if v is None else str(v))[:500] for k, v in flatten(cfg).items()}
        with mlflow.start_run(run_name=f"{stage}-{cfg.pair.name}-{tags.get('config_hash', '')[:8]}"):
            mlflow.log_params(params)
            clean = {k: float(v) for k, v in metrics.items() if v == v}  # NaN is not loggable
            if clean:
                mlflow.log_metrics(clean)  # one batched call: ~5 ms per call on sqlite
            mlflow.set_tags({**tags, "stage": stage})
            for path in artifacts:
                mlflow.log_artifact(str(path))
        return True
    except Exception as err:  # noqa: BLE001 - a dead server must not cost the measured results
        print(f"speclab: warning: run NOT logged to MLflow at {cfg.mlflow.tracking_uri} ({type(err).__name__}: "
              f"{str(err).splitlines()[0] if str(err) else ''}); its Parquet is kept", file=sys.stderr)
        return False
