"""One JSON request over the standard library: the stack's health checks and API calls,
the early MLflow run, and the tests that talk to those servers.

urllib, not httpx: httpx costs ~0.1 s to import (most of it for its command line),
which ``vfops eval`` would pay at every start for two REST calls. Its modules are
imported on the first call, not with this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def json_request(
    method: str,
    url: str,
    body: Any = None,
    *,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
    proxies: bool = True,
) -> tuple[int, Any]:
    """Send ``body`` (JSON-encoded, if not ``None``) to ``url``; return the status and the
    decoded JSON body (``None`` when it is empty or not JSON), error statuses included.

    ``proxies=False`` ignores the ``*_PROXY`` variables (loopback services must not be
    asked for through a proxy); by default they are honoured, as MLflow's client does.
    An unreachable server raises :class:`OSError` (``URLError`` is one).
    """
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    handlers = [] if proxies else [urllib.request.ProxyHandler({})]
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            status, payload = int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            status, payload = exc.code, exc.read()
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, None
