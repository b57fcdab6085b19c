"""Entry point: ``python -m pipeline.run [stage=NAME] [+sweep=NAME] [overrides]``.

Only wires the config to the stages' code; every knob lives in conf/.
"""
from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from pipeline.jobs import already_done, config_hash, output_path  # noqa: E402
from pipeline.stages import STAGES  # noqa: E402


def validate(cfg: DictConfig) -> list[str]:
    """Cheap checks before any model is loaded; returns the stage parts to run."""
    parts = list(cfg.stage.parts)
    unknown = [p for p in parts if p not in STAGES]
    if not parts or unknown:
        raise ValueError(f"unknown stage {unknown or parts}: allowed are {list(STAGES)}")
    if not isinstance(cfg.k, int) or cfg.k < 1:
        raise ValueError(f"k={cfg.k} is not allowed: the number of proposals must be an integer >= 1")
    if int(cfg.max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens={cfg.max_new_tokens} is not allowed: use an integer >= 1")
    return parts


def run_parts(cfg: DictConfig) -> None:
    from pipeline.context import build_context
    from pipeline.parquet import write_parquet
    from pipeline.tracking import environment_tags, log_stage_run

    parts = validate(cfg)
    todo = []
    for part in parts:
        done = already_done(cfg, part)
        if done:
            print(f"[{part}] already complete for this config: {done} (force=true reruns it)")
        else:
            todo.append(part)
    if not todo:
        return
    ctx = build_context(cfg)
    tags = {**environment_tags(str(ctx.pair.device), str(cfg.pair.dtype)), "config_hash": config_hash(cfg)}
    for part in todo:
        module = importlib.import_module(f"pipeline.stages.{part}")
        out = module.run(ctx)
        path = write_parquet(out.rows, module.SCHEMA, output_path(cfg, part))
        with tempfile.TemporaryDirectory() as tmp:
            resolved = Path(tmp) / "config.yaml"
            resolved.write_text(OmegaConf.to_yaml(cfg, resolve=True))
            logged = log_stage_run(cfg, part, out.metrics, [path, resolved], tags)
        print(f"[{part}] {cfg.pair.name}: wrote {path}" + ("" if logged else " (not logged to MLflow)"))
        for line in out.summary:
            print(f"[{part}] {line}")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run_parts(cfg)
    except (ValueError, FileNotFoundError) as err:
        # Bad input: one line naming the value and what is allowed, no traceback.
        print(f"speclab: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
