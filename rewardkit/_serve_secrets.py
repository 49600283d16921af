"""Keeping credentials out of what the reward server says: ``GET /info``, error messages and logs.

Two rules, applied together:

- a value under a credential-like key (``api_key``, ``*_token``, ``password``, ``secret``, ``authorization``,
  ``cookie``, ``credential``, ``private_key``, ...; any depth, any case, ``-`` / ``_`` / camelCase) is
  replaced by :data:`REDACTED`;
- every known secret *value* is replaced wherever it appears in a string: the server's bearer token, the
  values found under credential-like keys of the reward's config (every string under the key, also in lists;
  for ``Bearer <token>`` / ``Basic <token>`` the token alone too), and the values of environment variables
  whose names look like credentials (``OPENAI_API_KEY``, ``HF_TOKEN``, ``REWARDKIT_SERVE_TOKEN``, ...);
- the password of a URL with credentials (``https://user:password@host``) is replaced in every string.
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
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@")
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
        """Learn the values under credential-like keys of ``obj`` (a config dict) as secrets."""
        if isinstance(obj, dict):
            for k, v in obj.items():
                if is_secret_key(k):
                    self.add(_strings(v))
                else:
                    self.collect(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                self.collect(v)

    def text(self, s: str) -> str:
        for v in self._values:
            if v in s:
                s = s.replace(v, REDACTED)
        return _URL_PASSWORD.sub(r"\1" + REDACTED + "@", s) if "@" in s else s

    def __call__(self, obj: Any) -> Any:
        """``obj`` (JSON-like) with credential-like keys' values and known secret values redacted."""
        if isinstance(obj, dict):
            return {k: (REDACTED if is_secret_key(k) and v not in (None, "", False) else self(v))
                    for k, v in obj.items()}
        if isinstance(obj, list):
            return [self(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self(v) for v in obj)
        if isinstance(obj, str):
            return self.text(obj)
        return obj


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
        record.msg, record.args = self.redactor.text(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.text(record.exc_text)
        return True
