"""Secrets out of everything vfops records or prints: API keys in any encoding, and
credentials in URLs.

Two tools, for two kinds of text:

- :class:`Redactor` replaces *known* secrets (the API key a client sends, the
  credentials its base URL carries) wherever they occur, in the forms an endpoint
  may echo them back in: as is, URL-encoded (``quote`` / ``quote_plus``, either hex
  case), base64 (standard or URL-safe, padded or not, alone or inside a longer
  encoded text such as a basic-auth ``user:key`` or a JSON document), hex, and
  JSON-escaped; and any word that is a long enough piece of one (an echo cut
  short). It is applied to model responses as they arrive, so no store, log or
  score ever sees an echoed key, and to error messages.
- :func:`public_url` / :func:`redact_url_credentials` drop what *looks like* a
  credential in a URL (``user:password@``, ``?api-key=...``, ``&sig=...``): for URLs
  vfops itself records (a run's base URL) or puts in a message. Never applied to a
  model's text, whose URLs are its answer.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final
from urllib.parse import (
    parse_qsl,
    quote,
    quote_plus,
    unquote,
    unquote_plus,
    urlencode,
    urlsplit,
    urlunsplit,
)

__all__ = [
    "MIN_PARTIAL_CHARS",
    "MIN_SECRET_CHARS",
    "REDACTED",
    "Redactor",
    "basic_auth",
    "is_credential_param",
    "public_url",
    "redact_secrets",
    "redact_url_credentials",
    "secret_forms",
    "url_secrets",
]

REDACTED: Final = "[redacted]"
"""What a secret is replaced with."""

MIN_SECRET_CHARS: Final = 8
"""Shorter values (``EMPTY``, a local server's ``x``) are no secret worth mangling
every text that happens to contain them."""

MIN_PARTIAL_CHARS: Final = 12
"""A word that is this long a piece of a secret (a key cut short by a length limit,
or its tail after a prefix the server dropped) is redacted too."""

_LONG_WORD = re.compile(rf"[A-Za-z0-9_\-]{{{MIN_PARTIAL_CHARS},}}")
_PERCENT = re.compile(r"%[0-9A-F]{2}")
_QUERY_PAIR = re.compile(r"([^&=]+)=([^&]*)")

_CREDENTIAL_PARAM = re.compile(
    r"key|token|secret|passw|pwd|sig|auth|credential|session|jwt|^code$|^pass$", re.IGNORECASE
)
"""Query parameter names that carry a credential (``api-key``, ``api_key``, ``key``,
``access_token``, ``sig``, ``X-Amz-Signature``, ``auth``, ``password``...)."""


def is_credential_param(name: str) -> bool:
    """Whether a URL query parameter named ``name`` looks like it carries a credential."""
    return _CREDENTIAL_PARAM.search(name) is not None


def _base64_cores(raw: bytes) -> set[str]:
    """The base64 text that encodes ``raw`` at each of the three byte alignments it can
    have inside a longer encoded text, less the characters that also depend on the
    bytes around it: one of them appears in any base64 of any text holding ``raw``
    (``user:key``, ``{"key": ...}``), padded or not."""
    cores: set[str] = set()
    for offset in range(3):
        body = raw[: len(raw) - (len(raw) + offset) % 3]  # whole groups only
        if len(body) < 6:
            continue
        encoded = base64.b64encode(b"\0" * offset + body).decode()
        core = encoded[(0, 2, 3)[offset] :]  # the characters that mix in the prefix
        cores.add(core)
        cores.add(core.translate(str.maketrans("+/", "-_")))
    return cores


@functools.lru_cache(maxsize=64)
def secret_forms(secret: str) -> tuple[str, ...]:
    """Every form of ``secret`` :class:`Redactor` looks for, longest first."""
    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    forms |= {_PERCENT.sub(lambda match: match.group().lower(), form) for form in list(forms)}
    for form in list(forms):  # JSON string escapes: "\/" and "\u00e9" as encoders write them
        escaped = json.dumps(form)[1:-1]
        forms |= {escaped, escaped.replace("/", "\\/"), json.dumps(form, ensure_ascii=False)[1:-1]}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        padded = encode(raw).decode()
        forms |= {padded, padded.rstrip("=")}
    forms |= _base64_cores(raw)
    forms |= {raw.hex(), raw.hex().upper()}
    return tuple(sorted((form for form in forms if form), key=len, reverse=True))


class Redactor:
    """Replaces ``secrets`` (and their encoded forms, :func:`secret_forms`) by
    ``[redacted]`` in text and in decoded JSON. Secrets shorter than
    :data:`MIN_SECRET_CHARS` are left alone. Build it once per client: the forms are
    computed here."""

    __slots__ = ("_forms", "_partial")

    def __init__(self, secrets: Iterable[str]) -> None:
        keys = sorted({secret for secret in secrets if len(secret) >= MIN_SECRET_CHARS})
        forms = {form for key in keys for form in secret_forms(key)}
        self._forms = tuple(sorted(forms, key=len, reverse=True))
        # a piece of an encoded form is as telling as a piece of the key
        self._partial = tuple(form for form in self._forms if len(form) >= MIN_PARTIAL_CHARS)

    def __bool__(self) -> bool:
        return bool(self._forms)

    def text(self, text: str) -> str:
        """``text`` with every secret, in every form, and every long piece of one redacted."""
        if not self._forms or not text:
            return text
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        partial = self._partial

        def piece(match: re.Match[str]) -> str:
            word = match.group()
            return REDACTED if any(word in form for form in partial) else word

        return _LONG_WORD.sub(piece, text)

    def json(self, value: Any) -> Any:
        """``value`` (decoded JSON) with :meth:`text` applied to every string in it,
        keys included; containers are rebuilt only where something changed."""
        if not self._forms:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            items = [self.json(item) for item in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        if isinstance(value, dict):
            pairs = [(self.text(key), self.json(item)) for key, item in value.items()]
            same = all(
                k is a and v is b for (k, v), (a, b) in zip(pairs, value.items(), strict=True)
            )
            return value if same else dict(pairs)
        return value


def redact_secrets(text: str, secrets: Sequence[str]) -> str:
    """``text`` with each of ``secrets`` (an API key) replaced by ``[redacted]``:
    wherever it occurs (after ``Bearer ``, inside a URL...), in any encoded form
    (:func:`secret_forms`), and any word of at least :data:`MIN_PARTIAL_CHARS`
    characters that is part of one (a truncated echo). Secrets shorter than
    :data:`MIN_SECRET_CHARS` are left alone."""
    return Redactor(secrets).text(text)


def url_secrets(url: str) -> tuple[str, ...]:
    """The credentials ``url`` carries (its userinfo's user and password, the values of
    credential-looking query parameters), as written and decoded: secrets for a
    :class:`Redactor` of everything sent to or read from that URL."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ()
    found: set[str] = set()
    for value in (parts.username, parts.password):
        if value:
            found |= {value, unquote(value)}
    for name, raw in _QUERY_PAIR.findall(parts.query):
        if raw and is_credential_param(unquote_plus(name)):
            found |= {raw, unquote_plus(raw)}
    return tuple(sorted(found))


def public_url(url: str) -> str:
    """``url`` without the credentials it may carry: no ``user:password@``, no query
    parameter that looks like a credential (``api-key``, ``key``, ``token``, ``sig``...;
    others such as ``api-version`` are kept). What vfops records and prints of a URL;
    the request itself still uses the full one."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query:
        kept = [
            (name, value)
            for name, value in parse_qsl(query, keep_blank_values=True)
            if not is_credential_param(name)
        ]
        query = urlencode(kept)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>]*[^\s'\"<>.,;:!?)\]}]")
"""A URL in prose: up to the next space or quote, less trailing punctuation."""


def redact_url_credentials(text: str) -> str:
    """``text`` (a message vfops writes, never a model's output) with every URL in it
    passed through :func:`public_url`."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda match: _public_or_same(match.group()), text)


def _public_or_same(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc and not any(
        is_credential_param(name) for name, _ in parse_qsl(parts.query, keep_blank_values=True)
    ):
        return url  # untouched, byte for byte (no re-encoding of its query)
    return public_url(url)


def basic_auth(user: str, password: str) -> str:
    """The ``Authorization`` value of HTTP basic auth for ``user`` / ``password``."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return f"Basic {token}"
