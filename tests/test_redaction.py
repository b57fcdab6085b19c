"""No secret in a record: every credential form a tracking URI can carry is masked wherever it is written or
printed (through Hydra's escaping too), the command line's credentials never reach Hydra (lifted into the
environment) and the job still connects with them. End to end, per launcher: tests/test_secrets_e2e.py."""
from __future__ import annotations

import logging
import pickle
from urllib.parse import quote, urlsplit

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from requests.utils import get_auth_from_url

from pipeline.tracking.redact import RedactFilter, redact, redact_all
from pipeline.tracking.secrets import ENV_PREFIX, lift, resolve
from store.credentials import connectable, public_url
from store.mlflow_probe import first_line, unreachable

SECRET = "S3cretPw"


@pytest.mark.parametrize("text, expected", [
    ("http://alice:S3cretPw@host:5000", "http://alice:***@host:5000"),
    ("mlflow.tracking_uri=https://alice:p%40ss@host/x k=2", "mlflow.tracking_uri=https://alice:***@host/x k=2"),
    ("https://alice:p@ss@host/x", "https://alice:***@host/x"),  # an unencoded '@' in the password
    ("http://alice:p?w#x/y@127.0.0.1:15099/z", "http://alice:***@127.0.0.1:15099/z"),  # unencoded '?', '#', '/'
    ("""mlflow.tracking_uri='http://alice:p"w@h:1'""", "mlflow.tracking_uri='http://alice:***@h:1'"),  # a '"'
    ('"http://alice:p\'w@h:1"', '"http://alice:***@h:1"'),
    ("http://TOKEN123abc@host/", "http://***@host/"),  # a token as the user name (a user name alone too)
    ("https://ghp_0123456789abcdefghij0123456789abcdef:x-oauth-basic@github.com",
     "https://***:***@github.com"),  # a user name that is no plain name is masked with the password
    # Hydra's escaping of each job's overrides in a multirun, and that text again inside JSON.
    (r"mlflow.tracking_uri=http\://alice\:S3cretPw@127.0.0.1\:15099 k=1",
     r"mlflow.tracking_uri=http\://alice\:***@127.0.0.1\:15099 k=1"),
    (r'{"overrides": "mlflow.tracking_uri=http\\://alice\\:S3cretPw@h\\:1 k\\=2"}',
     r'{"overrides": "mlflow.tracking_uri=http\\://alice\\:***@h\\:1 k\\=2"}'),
    (r"x=http\://alice\:p\ w\,v@h", r"x=http\://alice\:***@h"),  # an escaped space and comma in the password
    ("x='http://alice:p w@h'", "x='http://alice:***@h'"),  # a space, inside quotes
    (str(["k=1", """u='http://alice:p?w#x"y@z/v@h:1'"""]), r"""['k=1', 'u=\'http://alice:***@h:1\'']"""),  # a repr
    (r"http\://h/?token\=T0kenX", r"http\://h/?token\=***"),
    ("http://host/?token=T0kenX&run=3", "http://host/?token=***&run=3"),
    ("http://host/api?access_token=a&X-Amz-Signature=b&keyboard=c",
     "http://host/api?access_token=***&X-Amz-Signature=***&keyboard=c"),
    ("http://h/#access_token=a&state=s", "http://h/#access_token=***&state=s"),  # an OAuth reply's fragment
    ("'databricks://u:T0kenX@ws'", "'databricks://u:***@ws'"),
    ("postgresql://mlflow:pw@db:5432/mlflow?sslmode=require", "postgresql://mlflow:***@db:5432/mlflow?sslmode=require"),
    ("http://a:p@h1,http://b:q@h2", "http://a:***@h1,http://b:***@h2"),  # a sweep over two URIs
    ("http://alice:***@h and http://alice:***2@h", "http://alice:***@h and http://alice:***2@h"),  # masked stay
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ("file:///tmp/a@b", "file:///tmp/a@b"),
    ("['http://h/x', 'bob@example.com']", "['http://h/x', 'bob@example.com']"),
    ("see http://h/x, mail bob@example.com", "see http://h/x, mail bob@example.com"),
    ("no uri here: a:b@c", "no uri here: a:b@c"),
])
def test_redact(text, expected):
    assert redact(text) == expected


SECRET_NAMES = ("pass", "passwd", "password", "PWD", "secret", "client_secret", "token", "access_token", "id_token",
                "refresh_token", "jwt", "bearer", "auth", "Authorization", "apikey", "api_key", "api-key", "apiKey",
                "key", "X-Api-Key", "sig", "signature", "credential", "credentials", "X-Amz-Credential", "session",
                "sessionid", "cookie", "private_key", "PRIVATE")


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_query_parameters_by_name(name):
    assert redact(f"http://h/x?run=3&{name}=V4lue&k=2") == f"http://h/x?run=3&{name}=***&k=2"


@pytest.mark.parametrize("name", ("run", "experiment", "keyboard", "k", "sslmode", "workspace"))
def test_other_query_parameters_are_kept(name):
    assert redact(f"http://h/x?{name}=v") == f"http://h/x?{name}=v"


def test_redact_all_and_the_log_filter():
    assert redact_all({"a": ["http://u:pw@h", 3], "b": {"c": "x?token=t"}}) == \
        {"a": ["http://u:***@h", 3], "b": {"c": "x?token=t"}}  # no scheme, no URI
    record = logging.LogRecord("x", logging.INFO, "f", 1, "#0 : %s", (r"uri=http\://u\:S3cretPw@h",), None)
    assert RedactFilter().filter(record) and record.getMessage() == r"#0 : uri=http\://u\:***@h"


def _job_value(override: str) -> str:
    """The value a job of a multirun reads: Hydra parses the override, escapes it into the job's overrides
    (``http\\://...``) and parses that again."""
    parsed = OverridesParser.create().parse_override(override)
    per_job = f"{parsed.key_or_group}={parsed.get_value_element_as_str()}"
    return OverridesParser.create().parse_override(per_job).value()


@pytest.mark.parametrize("uri, secrets", [
    ("http://alice:S3cretPw@127.0.0.1:15099", ["S3cretPw"]),
    ('http://alice:S3c?r#t"P@w/d@127.0.0.1:15099/x', ["S3c", "r#t", "P@w"]),
    ("http://TOKEN123abc@127.0.0.1:15099", ["TOKEN123abc"]),
    ("http://127.0.0.1:15099/?pass=Pw1&Authorization=Pw2&jwt=Pw3&run=1", ["Pw1", "Pw2", "Pw3"]),
])
def test_the_command_line_holds_a_mask_and_the_job_connects_with_the_secret(uri, secrets):
    env: dict[str, str] = {}
    argv = lift(["-m", "k=1,2", f"mlflow.tracking_uri='{uri}'"], env)
    assert argv[:2] == ["-m", "k=1,2"] and "***" in argv[2]
    assert not [s for s in secrets if s in " ".join(argv)]
    assert list(env) and all(k.startswith(ENV_PREFIX) for k in env)
    value = _job_value(argv[2])
    assert resolve(value, env) == connectable(uri)
    assert resolve(value, {}) == value  # without the environment: the mask, never a guess


def test_a_password_with_special_characters_is_connected_whole():
    password = 'S3c?r#t"P@w/d e'
    real = connectable(f"http://alice:{password}@127.0.0.1:15099/base")
    assert real == f"http://alice:{quote(password, safe='')}@127.0.0.1:15099/base"
    assert urlsplit(real).port == 15099 and urlsplit(real).path == "/base"  # no "Port could not be cast"
    assert get_auth_from_url(real) == ("alice", password)  # what MLflow's HTTP client sends


def test_two_secrets_that_mask_alike_stay_apart():
    env: dict[str, str] = {}
    argv = lift(["a=http://alice:one@h", "b=http://alice:two@h", "c=http://alice:one@h"], env)
    assert argv == ["a=http://alice:***@h", "b=http://alice:***2@h", "c=http://alice:***@h"]
    assert [resolve(a.split("=", 1)[1], env) for a in argv] == \
           ["http://alice:one@h", "http://alice:two@h", "http://alice:one@h"]


def test_a_command_line_without_credentials_is_left_alone():
    env: dict[str, str] = {}
    argv = ["-m", "k=1,2", "mlflow.tracking_uri=sqlite:///x.db", "outputs_dir=/tmp/a@b", "campaign=c"]
    assert lift(argv, env) == argv and not env


def test_a_masked_uri_is_a_clear_outage_not_a_connection():
    problem = unreachable("http://alice:***@127.0.0.1:9")
    assert problem and "masked credential" in problem and "http://alice:***@127.0.0.1:9" in problem


def test_library_errors_are_masked():
    err = ConnectionError(f"API request to http://alice:{SECRET}@h:5000/api/2.0/x failed")
    assert first_line(err) == "ConnectionError: API request to http://alice:***@h:5000/api/2.0/x failed"


def test_the_printed_link_has_no_credentials():
    assert public_url("http://alice:***@127.0.0.1:5000/base/?token=***") == "http://127.0.0.1:5000/base"
    assert public_url("sqlite:///mlflow.db") is None


def test_a_pickled_tracker_holds_no_credentials():
    import mlflow

    from pipeline.tracking.mlflow_runs import Tracker

    tracker = Tracker("http://alice:***@127.0.0.1:9", "speclab", True)
    tracker._client = mlflow.MlflowClient(f"http://alice:{SECRET}@127.0.0.1:9")  # as after connecting
    assert SECRET.encode() not in pickle.dumps(tracker)
