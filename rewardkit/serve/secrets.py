"""Keeping credentials out of everything the reward server says: every answer (results' ``info``, ``details``,
``errors``, ``rationales``; ``GET /info``; error messages) and its logs.

Rules, applied together:

- a value under a credential-like key (``api_key``, ``*_token``, ``password``, ``secret``, ``authorization``,
  ``cookie``, ``credential``, ``private_key``, ...; any depth, any case, ``-`` / ``_`` / camelCase) is
  replaced by :data:`REDACTED` (when it holds text: a number or a flag under such a key is left as it is);
- every known secret *value* is replaced wherever it appears in a string: the server's bearer token, the
  values found under credential-like keys of the reward's config (every string under the key, also in lists;
  for ``Bearer <token>`` / ``Basic <token>`` the token alone too), the credentials of every URL in the config
  (below), and the values of environment variables whose names look like credentials (``OPENAI_API_KEY``,
  ``HF_TOKEN``, ``REWARDKIT_SERVE_TOKEN``, ...). Where secrets overlap or one contains another, the union of
  their occurrences is replaced (never a part of one left over);
- the credentials of a URL are replaced in every string: the password of ``https://user:password@host`` (a raw
  ``@`` inside it included: the user information ends at the last ``@`` before the host), the whole user
  information of ``https://TOKEN@host``, and the value of a query parameter with a credential-like name
  (``?api_key=...``, ``&access_token=...``, ``?key=...``, ``?sig=...``).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Iterable

REDACTED = "***"

_PARTS = ("password", "passwd", "secret", "authorization", "cookie", "credential", "apikey", "privatekey",
          "accesskey", "sessionkey", "bearer")
_MIN_SECRET = 4  # shorter values would redact ordinary words
_MIN_ENV_SECRET = 8  # environment values are guessed from names: "true" under USE_AUTH_TOKEN is no secret
# scheme://userinfo@host: the user information runs to the last "@" before the path, query or fragment
_URL_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)([^/?#\s\"'<>]*)@")
# ?name=value / &name=value / ;name=value in a URL's query
_QUERY_PARAM = re.compile(r"([?&;]([A-Za-z0-9_.\-\[\]]+)=)([^&#\s\"'<>]+)")
_QUERY_KEYS = frozenset({"key", "sig", "signature", "auth", "code"})
_AUTH_SCHEME = re.compile(r"^(?:bearer|basic|token)\s+(\S+)$", re.IGNORECASE)


def is_secret_key(key: Any) -> bool:
    """``api_key``, ``API-Key``, ``apiKey``, ``access_token``, ``HF_TOKEN``, ``client_secret``, ``password``,
    ``Authorization``...; not ``tokenizer`` or ``max_new_tokens``."""
    if not isinstance(key, str):
        return False
    k = re.sub(r"[^a-z0-9]", "", key.lower())
    return k.endswith("token") or any(p in k for p in _PARTS)


class Redactor:
    """Redacts credential-like keys and known secret values (see the module doc)."""

    def __init__(self, secrets: Iterable[str | None] = (), env: dict[str, str] | None = None):
        env = os.environ if env is None else env
        self._values: list[str] = []
        self.add(secrets)
        self.add((v for k, v in env.items() if is_secret_key(k)), min_len=_MIN_ENV_SECRET)

    def add(self, values: Iterable[Any], min_len: int = _MIN_SECRET) -> None:
        new = {v.strip() for v in values if isinstance(v, str) and len(v.strip()) >= min_len}
        self._values = sorted(set(self._values) | new, key=len, reverse=True)  # longest first

    def collect(self, obj: Any) -> None:
        """Learn the values under credential-like keys of ``obj`` (a config dict), and the credentials of every
        URL in its strings, as secrets."""
        if isinstance(obj, str):
            self.add(url_secrets(obj))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                if is_secret_key(k):
                    self.add(_strings(v))
                else:
                    self.collect(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                self.collect(v)

    def text(self, s: str) -> str:
        """``s`` with every occurrence of a known secret replaced (overlapping or nested occurrences as one),
        then URL credentials (see the module doc)."""
        spans = []
        for v in self._values:
            start = s.find(v)
            while start != -1:
                spans.append((start, start + len(v)))
                start = s.find(v, start + 1)
        if spans:
            spans.sort()
            out, pos, end = [], 0, -1
            for a, b in spans:
                if a > end:  # a new run of secret characters
                    if end >= 0:
                        out.append(REDACTED)
                    out.append(s[pos:a])
                    end = b
                else:
                    end = max(end, b)
                pos = end
            out.append(REDACTED)
            out.append(s[pos:])
            s = "".join(out)
        return _url_credentials(s)

    def __call__(self, obj: Any) -> Any:
        """``obj`` (JSON-like) with credential-like keys' values and known secret values redacted."""
        if isinstance(obj, dict):
            return {k: (REDACTED if is_secret_key(k) and _has_text(v) else self(v)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self(v) for v in obj)
        if isinstance(obj, str):
            return self.text(obj)
        return obj


def _url_credentials(s: str) -> str:
    if "@" in s:
        s = _URL_USERINFO.sub(_redact_userinfo, s)
    if "=" in s:
        s = _QUERY_PARAM.sub(_redact_param, s)
    return s


def _redact_userinfo(m: re.Match) -> str:
    user, colon, _ = m.group(2).partition(":")
    return m.group(1) + (user + ":" + REDACTED if colon else REDACTED) + "@"


def _secret_param(name: str) -> bool:
    return is_secret_key(name) or name.lower() in _QUERY_KEYS


def _redact_param(m: re.Match) -> str:
    return m.group(1) + REDACTED if _secret_param(m.group(2)) else m.group(0)


def url_secrets(s: str) -> list[str]:
    """The credentials in the URLs of ``s``: passwords (or whole user information without one) and the values
    of credential-like query parameters."""
    out = []
    if "@" in s:
        for m in _URL_USERINFO.finditer(s):
            user, colon, password = m.group(2).partition(":")
            out.append(password if colon else user)
    if "=" in s:
        out += [m.group(3) for m in _QUERY_PARAM.finditer(s) if _secret_param(m.group(2))]
    return out


def _has_text(obj: Any) -> bool:
    """Whether ``obj`` holds a non-empty string (a number or a flag under a credential-like key is no secret)."""
    if isinstance(obj, str):
        return bool(obj)
    if isinstance(obj, dict):
        return any(_has_text(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_text(v) for v in obj)
    return False


def _strings(obj: Any) -> list[str]:
    """Every string in ``obj`` (nested lists / dicts); for ``Bearer <token>`` also the token alone."""
    if isinstance(obj, str):
        m = _AUTH_SCHEME.match(obj.strip())
        return [obj] + ([m.group(1)] if m else [])
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _strings(v)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _strings(v)]
    return []


class RedactingFilter(logging.Filter):
    """A logging filter that redacts a record's message and traceback with a :class:`Redactor`."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logged as it is
            return True
        red = self.redactor.text
        if red(msg) != msg:
            # the arguments redacted one by one where that is enough (formatters such as uvicorn's access log
            # read them); otherwise the message is flattened to its redacted text
            args = record.args
            if isinstance(args, tuple) and isinstance(record.msg, str):
                new_args = tuple(red(a) if isinstance(a, str) else a for a in args)
                try:
                    flat = red(record.msg) % new_args if new_args else red(record.msg)
                except (TypeError, ValueError):
                    flat = None
                if flat is not None and red(flat) == flat:
                    record.msg, record.args = red(record.msg), new_args
                else:
                    record.msg, record.args = red(msg), None
            else:
                record.msg, record.args = red(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.text(record.exc_text)
        return True
