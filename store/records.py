"""A stage file: Parquet with an explicit schema and a provenance record, written atomically, read checked.

Each stage file carries, in its Parquet key-value metadata under ``speclab``, a JSON record of the job
that wrote it (stage, campaign, pair, config hash, row count, commit, start and end times, overrides,
inputs) and the content hash of its rows. That record is how a rerun tells a finished file from a foreign
or damaged one, how the analysis checks that a file lies where its job put it, and how it lists the jobs it
pooled. A file written before records held a content hash is checked against its published campaign's
checksums instead (``store.manifest``).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from store.compat import complete_table, later_missing
from store.files import atomic_write
from store.layout import StoreError, stage_paths
from store.manifest import check_published

META_KEY = b"speclab"
CONTENT_KEY = "content_sha256"
UNKNOWN_COMMIT = "unknown"
_TYPES = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
          "bool": pa.bool_()}


def make_schema(fields: list[tuple[str, str]]) -> pa.Schema:
    """A pyarrow schema from (name, type name) pairs; type names: string, int32, int64, float64, bool."""
    return pa.schema([(name, _TYPES[kind]) for name, kind in fields])


def content_sha256(table: pa.Table) -> str:
    """The hash of a table's rows: each column's name, type and values in order, as JSON (floats exactly, by
    their shortest repr), so it depends on the data alone, not on how Parquet encoded or compressed it."""
    digest = hashlib.sha256()
    for field, column in zip(table.schema, table.columns):
        digest.update(json.dumps([field.name, str(field.type), column.to_pylist()], default=str).encode())
    return digest.hexdigest()


def write_parquet(rows: list[dict] | pd.DataFrame, schema: pa.Schema, path: str | Path,
                  meta: dict | None = None) -> Path:
    """Write ``rows`` to ``path`` with ``schema`` (and ``meta`` as the provenance record, its row count and
    the content hash of its rows added).

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
        record = {**meta, "rows": table.num_rows, CONTENT_KEY: content_sha256(table)}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               META_KEY: json.dumps(record, sort_keys=True).encode()})
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


class StageFileError(StoreError):
    """A file that is not a complete stage result, or not the one its place names: ``problem`` says why."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path} {problem}")


@dataclass(frozen=True)
class StageFile:
    path: Path
    meta: dict  # the provenance record
    table: pa.Table

    @property
    def data(self) -> pd.DataFrame:
        return self.table.to_pandas()


def _open(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - any reader error means the same thing here
        raise StageFileError(path, f"is not a readable Parquet file ({type(err).__name__})") from None


def _record(pf: pq.ParquetFile, path: Path) -> dict | None:
    raw = (pf.schema_arrow.metadata or {}).get(META_KEY)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise StageFileError(path, "has a damaged provenance record") from None


def read_meta(path: str | Path) -> dict:
    """The provenance record of a stage file ({} when it has none); StageFileError when the file does not
    read as Parquet or its record is damaged."""
    return _record(_open(Path(path)), Path(path)) or {}


def _differs(what: str, meta: dict, key: str, expected: str | None) -> str | None:
    if expected is not None and meta.get(key) != expected:
        return f"{what} {meta.get(key)!r}, not {expected!r}"
    return None


def open_stage_file(path: str | Path, schema: pa.Schema | None = None, config_hash: str | None = None,
                    stage: str | None = None, campaign: str | None = None) -> StageFile:
    """A stage file read in full, or StageFileError saying why it is not a complete result of the job its
    name and place say: it must read as Parquet (data included), have ``schema``'s columns (or all but some
    added later, ``store.compat.LATER_COLUMNS``: the table then holds them at their defaults), carry a
    provenance record of this stage, campaign and config hash (each when given) whose pair and config hash
    make up its name, and hold exactly the rows that record says were written, whose content hash it holds
    (or, written before records held one, the bytes its published campaign's checksums list)."""
    path = Path(path)
    pf = _open(path)
    found = pf.schema_arrow.remove_metadata()
    if schema is not None and found != schema and later_missing(found, schema) is None:
        raise StageFileError(path, "has columns other than the stage's schema")
    meta = _record(pf, path)
    if meta is None:
        raise StageFileError(path, "carries no speclab provenance record (not a stage result)")
    problem = (_differs("was written by stage", meta, "stage", stage)
               or _differs("belongs to campaign", meta, "campaign", campaign)
               or _differs("was written for config", meta, "config_hash", config_hash))
    if problem is None and path.stem != f"{meta.get('pair')}-{meta.get('config_hash')}":
        problem = f"does not match its provenance record (pair {meta.get('pair')!r}, config {meta.get('config_hash')!r})"
    if problem is None and (pf.metadata.num_rows != meta.get("rows") or not pf.metadata.num_rows):
        problem = f"holds {pf.metadata.num_rows} rows where {meta.get('rows')} were written"
    if problem:
        raise StageFileError(path, problem)
    try:
        table = pf.read()  # the footer can be intact while a column chunk is not
    except Exception as err:  # noqa: BLE001
        raise StageFileError(path, f"has data that does not read ({type(err).__name__})") from None
    if CONTENT_KEY in meta:
        if content_sha256(table) != meta[CONTENT_KEY]:
            raise StageFileError(path, "holds rows whose content hash is not its provenance record's (damaged or edited)")
    elif problem := check_published(path):
        raise StageFileError(path, problem)
    if schema is not None and found != schema:
        table = complete_table(table, schema)
    return StageFile(path, meta, table)


def check_stage_file(path: str | Path, schema: pa.Schema, config_hash: str | None = None) -> str | None:
    """None when ``path`` is a complete stage file (``open_stage_file``); otherwise why not, in a few words."""
    try:
        open_stage_file(path, schema, config_hash)
    except StageFileError as err:
        return err.problem
    return None


def read_stage_files(outputs_dir: str | Path, campaign: str, stage: str) -> list[StageFile]:
    """Every finished file of a stage in a campaign, each checked against where it lies (the first bad
    one raises StageFileError)."""
    return [open_stage_file(p, stage=stage, campaign=campaign) for p in stage_paths(outputs_dir, campaign, stage)]


def git_commit() -> str:
    """The commit of the checkout this code runs from (``unknown`` outside git): what a record names."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or UNKNOWN_COMMIT
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN_COMMIT
