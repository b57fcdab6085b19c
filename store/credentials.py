"""Credentials in URIs, found wherever they are written and masked: ``http://alice:PW@host/?token=T`` reads
``http://alice:***@host/?token=***``.

A URI is found leniently, as a user types one: its userinfo is everything from ``scheme://`` to the LAST '@'
that a host[:port] follows (then the end, '/', '?', '#' or a character that ends a URI in text), so a
password may hold an unencoded '@', '/', '?', '#' or '"'. A token used as the user name (``http://TOKEN@host``)
is masked whole, and so is a user name that does not look like one; query and fragment parameters named like
a secret (SECRET_NAME) have their values masked.

Text is read through Hydra's escaping (``http\\://alice\\:PW@host``, as Hydra writes each job's overrides) and
through a JSON or YAML file's (``\\"``, doubled backslashes): a backslash escapes the character after it.

Pure standard library: the pipeline, the store and the analysis all mask with it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MASK = "***"
# A mask, numbered when two secrets of one command line would mask alike (pipeline/tracking/secrets.py).
MASKED = re.compile(r"\*\*\*\d*")
# Query or fragment parameter names whose values are secrets (case-insensitive): pass, passwd, password,
# passphrase, pwd, secret, token, access_token, id_token, refresh_token, jwt, bearer, auth, authorization,
# apikey, api_key, api-key, key, sig, signature, credential(s), session, cookie, private...
SECRET_NAME = re.compile(
    r"passw|passphrase|secret|token|jwt|bearer|auth|api.?key|signature|credential|session|cookie|private"
    r"|(?:^|[^a-z])(?:pass|pwd|key|sig)(?:$|[^a-z])|key$", re.IGNORECASE)
# A user name kept in the masked form; anything else (a long token, an e-mail address) is masked too.
PLAIN_USER = re.compile(r"[A-Za-z0-9._-]{1,24}")
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
HOST_PORT = re.compile(r"(?:[A-Za-z0-9._~%-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]*)?")
WHITESPACE = frozenset(" \t\r\n")
# Characters that end a URI in running text (unless escaped): whitespace, quotes, brackets, a sweep's comma.
ENDS = WHITESPACE | frozenset("'\"<>,)]}`")


@dataclass(frozen=True)
class Text:
    """A text as read: ``chars`` with escaping backslashes dropped (when ``escapes``), and for each char whether
    it was escaped and where its original text (backslashes included) starts and ends."""

    chars: str
    escaped: tuple[bool, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    @classmethod
    def read(cls, text: str, escapes: bool = True) -> Text:
        if not escapes or "\\" not in text:
            n = len(text)
            return cls(text, (False,) * n, tuple(range(n)), tuple(range(1, n + 1)))
        chars, escaped, starts, ends = [], [], [], []
        i, n = 0, len(text)
        while i < n:
            j = i
            while j < n - 1 and text[j] == "\\":
                j += 1
            chars.append(text[j])
            escaped.append(j > i)
            starts.append(i)
            ends.append(j + 1)
            i = j + 1
        return cls("".join(chars), tuple(escaped), tuple(starts), tuple(ends))

    def ends_uri(self, k: int) -> bool:
        return self.chars[k] in ENDS and not self.escaped[k]

    def original(self, start: int, end: int) -> tuple[int, int]:
        """The original text's span of the chars ``start:end``."""
        return self.starts[start], self.ends[end - 1]


@dataclass(frozen=True)
class Uri:
    """Where a URI lies in a ``Text`` (char indices): scheme at ``begin``, authority from ``auth``, its userinfo
    up to ``at`` (None: no userinfo), host up to ``host_end``, the whole URI up to ``end``."""

    begin: int
    auth: int
    at: int | None
    host_end: int
    end: int


def _host_end(t: Text, pos: int, stop: int) -> int | None:
    """Where a host[:port] starting at ``pos`` ends, when it ends where an authority may end."""
    m = HOST_PORT.match(t.chars, pos, stop)
    if not m or m.end() == pos:
        return None
    e = m.end()  # a quote ends it even when escaped: a URI in quotes inside a repr or a JSON string
    return e if e == stop or t.chars[e] in "/?#'\"" or t.ends_uri(e) else None


def find_uris(t: Text, spaces: bool = False) -> list[Uri]:
    """Every URI in ``t``. A URI ends at unescaped whitespace unless ``spaces`` (one command-line value, where a
    space can only be part of it) or it stands in quotes (then it ends at the closing quote)."""
    found = []
    schemes = list(SCHEME.finditer(t.chars))
    for i, m in enumerate(schemes):
        begin, auth = m.start(), m.end()
        stop = schemes[i + 1].start() if i + 1 < len(schemes) else len(t.chars)
        quote = t.chars[begin - 1] if begin and t.chars[begin - 1] in "'\"" and not t.escaped[begin - 1] else None
        for k in range(auth, stop):  # never past a line's end (a lone quote must not take the rest of a file)
            ch, free = t.chars[k], not t.escaped[k]
            if ch in "\r\n" or (free and (ch == quote or (ch in WHITESPACE and not quote and not spaces))):
                stop = k
                break
        at, host_end = None, None
        if auth < stop and t.chars[auth] != "/":  # "file:///x" has no authority
            for k in range(stop - 1, auth, -1):
                if t.chars[k] == "@" and (host_end := _host_end(t, k + 1, stop)) is not None:
                    at = k
                    break
        if at is None:
            m_host = HOST_PORT.match(t.chars, auth, stop)
            host_end = m_host.end() if m_host else auth
        end = next((k for k in range(host_end, stop) if t.ends_uri(k)), stop)
        found.append(Uri(begin, auth, at, host_end, end))
    return found


def secret_spans(t: Text, uri: Uri, masked: bool = False) -> list[tuple[int, int]]:
    """The char spans of ``uri`` that hold a secret: its password (or a token as the user name, or a user name
    that is no plain name) and the values of its secret-named parameters; masks already there only when
    ``masked``."""
    spans = []
    if uri.at is not None:
        userinfo = t.chars[uri.auth:uri.at]
        colon = userinfo.find(":")
        if colon < 0:
            spans.append((uri.auth, uri.at))
        else:
            user = userinfo[:colon]
            if user and not PLAIN_USER.fullmatch(user):
                spans.append((uri.auth, uri.auth + colon))
            if colon + 1 < len(userinfo):
                spans.append((uri.auth + colon + 1, uri.at))
    tail = t.chars[uri.host_end:uri.end]
    query, fragment = tail.find("?"), tail.find("#")
    sections = []  # the query and the fragment (an OAuth reply puts its token there)
    if query >= 0 and (fragment < 0 or query < fragment):
        sections.append((query + 1, fragment if fragment >= 0 else len(tail)))
    if fragment >= 0:
        sections.append((fragment + 1, len(tail)))
    for start, stop in sections:
        for m in re.finditer(r"([^&;=]*)=([^&;]*)", tail[start:stop]):
            if m.group(2) and SECRET_NAME.search(m.group(1)):
                spans.append((uri.host_end + start + m.start(2), uri.host_end + start + m.end(2)))
    return [(a, b) for a, b in spans if masked or not MASKED.fullmatch(t.chars[a:b])]


def _masked(text: str, escapes: bool, spaces: bool = False) -> str:
    t = Text.read(text, escapes)
    spans = [t.original(a, b) for uri in find_uris(t, spaces) for a, b in secret_spans(t, uri)]
    for a, b in sorted(spans, reverse=True):
        text = text[:a] + MASK + text[b:]
    return text


def redact(text: Any) -> Any:
    """``text`` with every credential of every URI in it masked (non-strings unchanged)."""
    if not isinstance(text, str) or "//" not in text:
        return text
    return _masked(text, escapes=True)


def mask_uri(uri: str) -> str:
    """One URI as given (a command-line value: no escapes, spaces part of it) with its credentials masked."""
    return _masked(uri, escapes=False, spaces=True)


def redact_all(data: Any) -> Any:
    """Nested plain data (dicts, lists, strings) with every string redacted."""
    if isinstance(data, dict):
        return {k: redact_all(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_all(v) for v in data]
    return redact(data)


def has_masked_secret(uri: str) -> bool:
    """Whether ``uri`` holds a mask where a credential goes (copied from a record, or its secret not passed on)."""
    t = Text.read(uri, escapes=False)
    return any(MASKED.fullmatch(t.chars[a:b]) for u in find_uris(t, spaces=True)
               for a, b in secret_spans(t, u, masked=True))


# Characters a URI's userinfo may hold as they are (RFC 3986: unreserved, sub-delims, ':' and '%XX').
USERINFO_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:")


def encode_userinfo(userinfo: str) -> str:
    """``userinfo`` with every character a URI cannot hold there percent-encoded ('%XX' kept as it is)."""
    out = []
    for i, ch in enumerate(userinfo):
        if ch in USERINFO_SAFE or (ch == "%" and re.fullmatch(r"[0-9A-Fa-f]{2}", userinfo[i + 1:i + 3])):
            out.append(ch)
        else:
            out.append("".join(f"%{b:02X}" for b in ch.encode()))
    return "".join(out)


def connectable(uri: str) -> str:
    """The URI to connect with: its userinfo (read leniently) percent-encoded, so that a password with '?', '#',
    '/', '@' or '"' reaches the server whole (clients decode the userinfo)."""
    t = Text.read(uri, escapes=False)
    found = find_uris(t, spaces=True)
    if len(found) != 1 or found[0].at is None or found[0].begin != 0:
        return uri
    u = found[0]
    return uri[:u.auth] + encode_userinfo(uri[u.auth:u.at]) + uri[u.at:]


def public_url(uri: str) -> str | None:
    """An http(s) URI without its userinfo, query and fragment: a link to print; None for other stores."""
    t = Text.read(uri, escapes=False)
    found = find_uris(t, spaces=True)
    if not found or not uri.lower().startswith(("http://", "https://")):
        return None
    u = found[0]
    host = uri[(u.at + 1 if u.at is not None else u.auth):u.host_end]
    path = re.split(r"[?#]", uri[u.host_end:u.end], maxsplit=1)[0]
    return f"{uri[:u.auth]}{host}{path.rstrip('/')}"
