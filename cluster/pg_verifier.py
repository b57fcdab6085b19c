"""The SQL that creates a PostgreSQL login role from the password in a pgpass file, as a SCRAM-SHA-256 verifier.

    python cluster/pg_verifier.py PGPASS_FILE ROLE

Prints `CREATE ROLE ... PASSWORD 'SCRAM-SHA-256$...'` for psql's stdin: the clear password stays in the file
(never on a command line, in a log or sent to the server), the way psql's `\\password` does it. The role is no
superuser and can create neither databases nor roles.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import sys
from pathlib import Path

ITERATIONS = 4096  # PostgreSQL's default scram_iterations


def scram_verifier(password: str, salt: bytes | None = None) -> str:
    """PostgreSQL's stored form of a SCRAM-SHA-256 password (RFC 5802/7677; pg_authid.rolpassword)."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, ITERATIONS)
    stored_key = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731 - three uses on one line
    return f"SCRAM-SHA-256${ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def pgpass_password(path: Path) -> str:
    """The password field of the pgpass file's first line (host:port:db:user:password)."""
    fields = path.read_text().splitlines()[0].split(":")
    if len(fields) != 5 or not fields[4]:
        sys.exit(f"pg_verifier: {path} is not one pgpass line host:port:database:user:password")
    return fields[4]


def main(pgpass: str, role: str) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", role):
        sys.exit(f"pg_verifier: role {role!r} is not a plain lower-case SQL name")
    verifier = scram_verifier(pgpass_password(Path(pgpass)))
    print(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
          f"PASSWORD '{verifier}';")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
