"""Entry point: ``python -m pipeline.run [stage=NAME] [+sweep=NAME] [overrides]``.

Only wires the config to the stage's code; every knob lives in conf/.
"""
from __future__ import annotations

import importlib
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

STAGES = ("quick",)


def stage_module(name: str):
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}: allowed are {list(STAGES)}")
    return importlib.import_module(f"pipeline.stages.{name}")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from pipeline.context import build_context

    try:
        module = stage_module(cfg.stage.name)
        module.run(build_context(cfg))
    except (ValueError, FileNotFoundError) as err:
        # Bad input: one line naming the value and what is allowed, no traceback.
        print(f"speclab: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
