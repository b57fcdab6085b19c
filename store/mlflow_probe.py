"""Is an MLflow tracking store usable? Found out in seconds, for the pipeline and the analysis alike.

It lives in the store (no Hydra or torch) because the analysis imports it too.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from store.credentials import has_masked_secret, redact

PROBE_TIMEOUT_S = 3.0
# No retries and a short timeout: a server that accepts connections but never answers must not hold us.
QUICK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(PROBE_TIMEOUT_S))}


def first_line(err: BaseException) -> str:
    """The error's first line, its URIs' credentials masked (MLflow's errors name the URL they called)."""
    text = redact(str(err)).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__


@contextmanager
def quick_http(settings: dict[str, str] = QUICK_HTTP) -> Iterator[None]:
    """MLflow's HTTP retry settings replaced for the block; the previous ones come back afterwards."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def unreachable(uri: str) -> str | None:
    """Why the store at ``uri`` cannot be used, or None; one socket connect and one API call, each bounded.

    Creating a sqlite store here, once, also keeps parallel jobs from racing on its schema.
    """
    if has_masked_secret(uri):
        return (f"{uri} holds a masked credential (***) and this process was not given the credential itself: "
                "give the URI on the command line of the process that starts the jobs, with a launcher that passes "
                "its environment on, or set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD / MLFLOW_TRACKING_TOKEN")
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        db = uri.removeprefix("sqlite:///")
        # MLflow would create the missing folders: a mistyped path must not become a new, empty store.
        if db and db != ":memory:" and not Path(db).parent.is_dir():
            return f"{uri}: folder {Path(db).parent} does not exist"
    if parsed.scheme in ("http", "https"):
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            socket.create_connection((parsed.hostname or "localhost", port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as err:
            return f"cannot connect to {parsed.hostname}:{port} ({first_line(err)})"
    with quick_http():
        try:
            import mlflow

            mlflow.MlflowClient(uri).search_experiments(max_results=1)
        except Exception as err:  # noqa: BLE001 - any failure means the same: do without the store
            if parsed.scheme in ("http", "https"):
                return f"connected, but no usable answer within {PROBE_TIMEOUT_S:.0f} s ({type(err).__name__})"
            return first_line(err)
    return None
