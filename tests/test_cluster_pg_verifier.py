"""cluster/pg_verifier.py: the SCRAM verifier it gives PostgreSQL is the one PostgreSQL computes itself, so the
cluster's MLflow role logs in with the password of its pgpass file, and the SQL makes no superuser."""
from __future__ import annotations

import base64
import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "cluster" / "pg_verifier.py"
spec = importlib.util.spec_from_file_location("pg_verifier", SCRIPT)
pg_verifier = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pg_verifier)

# PostgreSQL 15: `CREATE ROLE r LOGIN PASSWORD 'pencil'`, then pg_authid.rolpassword.
POSTGRES_SAYS = ("SCRAM-SHA-256$4096:j43MvVcxew9baHYxKbPDGQ==$GyCYdvS/QojrwSjYT6QUaPfQ29+TCE9D9mVzuyCCZp0="
                 ":Q+s46psDVGk6Vt/noP2XNlySfv7YXYj4ya8y+zkNGlE=")


def test_verifier_matches_postgres() -> None:
    salt = base64.b64decode("j43MvVcxew9baHYxKbPDGQ==")
    assert pg_verifier.scram_verifier("pencil", salt) == POSTGRES_SAYS


def test_sql_holds_no_clear_password_and_makes_no_superuser(tmp_path: Path) -> None:
    pgpass = tmp_path / "mlflow.pgpass"
    pgpass.write_text("127.0.0.1:15432:mlflow:speclab:0123abcdSECRET\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(pgpass), "speclab"], capture_output=True, text=True,
                         check=True).stdout
    assert "0123abcdSECRET" not in out
    assert "PASSWORD 'SCRAM-SHA-256$4096:" in out
    for word in ("NOSUPERUSER", "NOCREATEDB", "NOCREATEROLE"):
        assert word in out


def test_bad_role_name_is_refused(tmp_path: Path) -> None:
    pgpass = tmp_path / "p"
    pgpass.write_text("h:1:d:u:pw\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(pgpass), "x; drop"], capture_output=True, text=True)
    assert done.returncode != 0 and "not a plain lower-case SQL name" in done.stderr
