"""Messages of faults and of keys in the wrong place: never an empty file name, never a suggestion of the
key just refused."""
from __future__ import annotations

import errno
from dataclasses import fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config.schema import STAGE_SCHEMAS, register
from pipeline.jobs.errors import error_line

CONF = str(Path(__file__).resolve().parents[1] / "conf")
register()


@pytest.mark.parametrize("err, expected", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (OSError(errno.ENOSPC, "No space left on device", "/data/mlflow.db"), "/data/mlflow.db: No space left on device"),
    (OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b"), "/a -> /b: Invalid cross-device link"),
    (OSError("disk gone"), "disk gone"),
])
def test_an_os_error_never_shows_an_empty_file_name(err, expected):
    line = error_line(err)
    assert line == expected and not line.startswith(":")


def _foreign_keys() -> list[tuple[str, str]]:
    """(stage option, a key another stage option has and this one lacks), one per option."""
    own = {name: {f.name for f in fields(typ)} for name, typ in STAGE_SCHEMAS.items()}
    every = sorted(set().union(*own.values()))
    return [(name, next(k for k in every if k not in keys)) for name, keys in own.items() if set(every) - keys]


@pytest.mark.parametrize("stage, key", [("timing", "ks"), *_foreign_keys()])
def test_a_key_of_another_stage_is_never_suggested_back(stage, key):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        with pytest.raises(Exception) as exc:
            compose(config_name="config", overrides=[f"stage={stage}", f"stage.{key}=[2]"])
    line = error_line(exc.value)
    assert f"did you mean stage.{key}=" not in line and f"stage.{key} is not read by the" in line, line
    assert "\n" not in line


def test_mlflows_database_error_traceback_never_reaches_the_console(capfd):
    # An interrupt or a lock inside a sqlite commit: MLflow logs the error with its traceback on its own stderr
    # handler before raising; the tracker says the outage in one line, so that traceback must not print.
    import mlflow.store.db.utils as db_utils

    import pipeline.tracking.mlflow_runs  # noqa: F401 - what the pipeline's processes import

    try:
        raise RuntimeError("database is locked")
    except RuntimeError:
        db_utils._logger.exception("SQLAlchemy database error. The following exception is caught.\n%s", "x")
    out, err = capfd.readouterr()
    assert "SQLAlchemy database error" not in out + err
