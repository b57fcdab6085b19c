"""Parquet output with an explicit schema and a provenance record, written atomically.

Each stage file carries, in its Parquet key-value metadata under ``speclab``, a JSON record of
the job that wrote it (stage, campaign, config hash, row count, commit, start and end times).
That record is how a rerun tells a finished file from a foreign or damaged one, and how the
analysis lists the jobs it pooled.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.files import atomic_write

META_KEY = b"speclab"


def write_parquet(rows: list[dict] | pd.DataFrame, schema: pa.Schema, path: str | Path,
                  meta: dict | None = None) -> Path:
    """Write ``rows`` to ``path`` with ``schema`` (and ``meta`` as the provenance record).

    The explicit schema matters: a reader of a folder takes its schema from the first file,
    so every file of a stage must agree on column names and types.
    """
    path = Path(path)
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=schema.names)
    missing = [n for n in schema.names if n not in df.columns]
    if missing:
        raise ValueError(f"rows lack columns {missing} required by the schema of {path.name}")
    table = pa.Table.from_pandas(df[schema.names], schema=schema, preserve_index=False)
    if meta is not None:
        record = {**meta, "rows": table.num_rows}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               META_KEY: json.dumps(record, sort_keys=True).encode()})
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_meta(path: str | Path) -> dict:
    """The provenance record of a stage file ({} when it has none). Raises if the file is not Parquet."""
    raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    return json.loads(raw) if raw else {}


def check_stage_file(path: str | Path, schema: pa.Schema, config_hash: str | None = None) -> str | None:
    """None when ``path`` is a complete stage file; otherwise why not, in a few words.

    Complete: it reads as Parquet, its columns are ``schema``'s, it carries a provenance record
    (of ``config_hash`` when given) and holds exactly the rows that record says were written.
    """
    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - any reader error means the same thing here
        return f"not a readable Parquet file ({type(err).__name__})"
    if pf.schema_arrow.remove_metadata() != schema:
        return "its columns are not the stage's schema"
    raw = (pf.schema_arrow.metadata or {}).get(META_KEY)
    if not raw:
        return "it carries no speclab provenance record"
    try:
        meta = json.loads(raw)
    except ValueError:
        return "its provenance record is damaged"
    if config_hash is not None and meta.get("config_hash") != config_hash:
        return f"it was written for config {meta.get('config_hash')!r}, not {config_hash!r}"
    if pf.metadata.num_rows != meta.get("rows") or not pf.metadata.num_rows:
        return f"it holds {pf.metadata.num_rows} rows where {meta.get('rows')} were written"
    try:
        pf.read()  # the footer can be intact while a column chunk is not
    except Exception as err:  # noqa: BLE001
        return f"its data does not read ({type(err).__name__})"
    return None


_TYPES = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
          "bool": pa.bool_()}


def make_schema(fields: list[tuple[str, str]]) -> pa.Schema:
    """A pyarrow schema from (name, type name) pairs; type names: string, int32, int64, float64, bool."""
    return pa.schema([(name, _TYPES[kind]) for name, kind in fields])
