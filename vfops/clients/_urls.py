"""Credentials in a base URL, and routes under one that has a query.

``http://user:pw@host/v1`` names basic-auth credentials, which aiohttp will not send
next to the client's own ``Authorization`` header (it raises); they are taken out of
the URL and sent as that header instead (:func:`split_userinfo`). A query on the base
URL (``?api-version=...``, a gateway's ``?api-key=...``) stays on every request's URL,
after the route (:func:`route_url`), not in front of it.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["route_url", "split_userinfo"]


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@`` and, when it had one, the decoded
    ``(user, password)`` (an empty password when only a user was given, as curl reads it)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, (unquote(user), unquote(password))


def route_url(base_url: str, route: str) -> str:
    """``base_url`` with ``/route`` appended to its path, its query kept after it."""
    parts = urlsplit(base_url)
    path = f"{parts.path.rstrip('/')}/{route.lstrip('/')}"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))
