"""Compose the pipeline's Hydra config for tests (tiny random pair, temporary outputs)."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from pipeline.config.schema import register

CONF = str(Path(__file__).resolve().parents[1] / "conf")


register()


def make_cfg(tmp_path: Path, *overrides: str):
    base = ["pair=tiny_random", "prompts=smoke", "max_new_tokens=12", "device=cpu",
            f"outputs_dir={tmp_path / 'outputs'}", "mlflow.enabled=false"]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=base + list(overrides))
