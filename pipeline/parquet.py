"""Parquet output with an explicit schema, written atomically (temp file, then rename)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def write_parquet(rows: list[dict] | pd.DataFrame, schema: pa.Schema, path: str | Path) -> Path:
    """Write ``rows`` to ``path`` with ``schema``; a reader never sees a half-written file.

    The explicit schema matters: a reader of a folder takes its schema from the first file,
    so every file of a stage must agree on column names and types.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=schema.names)
    missing = [n for n in schema.names if n not in df.columns]
    if missing:
        raise ValueError(f"rows lack columns {missing} required by the schema of {path.name}")
    table = pa.Table.from_pandas(df[schema.names], schema=schema, preserve_index=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".parquet")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_TYPES = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
          "bool": pa.bool_()}


def make_schema(fields: list[tuple[str, str]]) -> pa.Schema:
    """A pyarrow schema from (name, type name) pairs; type names: string, int32, int64, float64, bool."""
    return pa.schema([(name, _TYPES[kind]) for name, kind in fields])
