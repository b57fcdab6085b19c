"""A credential never enters Hydra: before Hydra reads the command line, every URI in it that holds one is
replaced by its masked form (``http://alice:***@host:5000``), and the URI itself waits in this process's
environment, under ``SPECLAB_CREDENTIAL_<hash of the masked form>``. Every launcher hands that environment to
its jobs (joblib's workers, submitit's local processes, sbatch's default --export=ALL), and a job connects
with ``resolve(uri)``. So overrides, Hydra's files, MLflow, Parquet provenance, job records and submitit's
pickles only ever hold the masked form.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import MutableMapping

from store.credentials import MASK, Text, connectable, find_uris, mask_uri, secret_spans

ENV_PREFIX = "SPECLAB_CREDENTIAL_"


def env_name(masked: str) -> str:
    """The environment variable that holds the URI whose masked form is ``masked``."""
    return ENV_PREFIX + hashlib.sha256(masked.encode()).hexdigest()[:16].upper()


def lift(argv: list[str], environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """``argv`` with each URI that holds a credential masked; the URIs (percent-encoded where a client could
    not read them as given) go to ``environ``. Two different URIs that mask alike get numbered masks
    (``***2``), so neither is mistaken for the other."""
    taken: dict[str, str] = {}  # masked form -> URI, on this command line
    lifted = []
    for arg in argv:
        t = Text.read(arg, escapes=False)
        pieces, done = [], 0
        for uri in find_uris(t, spaces=True):
            if not secret_spans(t, uri):
                continue
            given = arg[uri.begin:uri.end]
            real, masked = connectable(given), mask_uri(given)
            numbered, n = masked, 1
            while taken.get(numbered, real) != real:
                n += 1
                numbered = masked.replace(MASK, f"{MASK}{n}")
            taken[numbered] = real
            environ[env_name(numbered)] = real
            pieces += [arg[done:uri.begin], numbered]
            done = uri.end
        lifted.append("".join(pieces) + arg[done:])
    return lifted


def resolve(value: str, environ: MutableMapping[str, str] = os.environ) -> str:
    """``value`` (a tracking URI from the config) with each masked URI that ``lift`` took replaced by the URI
    itself; anything else unchanged."""
    if MASK not in value:
        return value
    t = Text.read(value, escapes=False)
    for uri in reversed(find_uris(t, spaces=True)):
        real = environ.get(env_name(value[uri.begin:uri.end]))
        if real:
            value = value[:uri.begin] + real + value[uri.end:]
    return value
