"""One pooled aiohttp session for JSON-over-HTTP model APIs, with typed errors.

Shared by :class:`~vfops.clients.OpenAIClient` and the vLLM training backend. It
sends pre-serialised bodies and returns raw response bytes (callers decode with
orjson), so no per-request models are built: the client side of a request stays
at a small fraction of a millisecond of CPU (``bench/client_transport.py``).
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Mapping, Sequence

import aiohttp
from yarl import URL

from vfops._errors import InvalidArgumentError
from vfops._redact import Redactor, public_url, redact_url_credentials
from vfops._version import __version__
from vfops.clients._errors import APIConnectionError, APITimeoutError, error_from_response
from vfops.clients._retry import parse_rate_limit_reset, parse_retry_after

CONNECT_TIMEOUT_CAP_S = 30.0
"""A connection that takes longer than this is not coming."""

KEEPALIVE_S = 30.0


def _env_proxy(url: str) -> str | None:
    """The proxy ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` give for ``url``
    unless ``NO_PROXY`` exempts its host, as the ``openai`` SDK (httpx) honours them.
    Resolved once per session: aiohttp's ``trust_env`` re-reads the environment and
    ``~/.netrc`` on every request."""
    parsed = URL(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parsed.scheme or "http") or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parsed.host or ""):
        return None
    return proxy


class HTTPTransport:
    """Requests to one server over a pool of keep-alive connections.

    ``headers`` go with every request. ``timeout_s`` bounds each request in wall-clock
    time, from the moment it has a connection slot to the last byte of its response:
    aiohttp's own read timeout restarts at every chunk, so a server dripping one byte
    a second would never trip it. The connect is also capped at 30 s. Waiting for a
    free connection (queueing, not a slow server) is not bounded: requests beyond
    ``max_connections`` wait on a semaphore before their clock starts, so aiohttp's
    pool never queues one inside it. ``secrets`` (the API key in ``headers``,
    credentials in the URL) never appear in an error's message or body, in any encoding
    (:class:`~vfops._redact.Redactor`, also :attr:`redactor` for callers' use). The
    aiohttp session is created on first use, in the running event loop; use and
    close the transport inside that loop.
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout_s: float,
        max_connections: int,
        secrets: Sequence[str] = (),
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidArgumentError(
                f"base_url must start with http:// or https://, got {public_url(base_url)!r}"
            )
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._secrets = tuple(secrets)
        self.redactor = Redactor(self._secrets)
        self._headers = {"User-Agent": f"vfops/{__version__}", **headers}
        self._timeout = self._client_timeout(timeout_s)
        self._slots = asyncio.Semaphore(max_connections)
        self._session: aiohttp.ClientSession | None = None

    @staticmethod
    def _client_timeout(timeout_s: float) -> aiohttp.ClientTimeout:
        # sock_read, not total: total would also count the wait for a pooled
        # connection, which is queueing, not a slow server.
        return aiohttp.ClientTimeout(
            total=None,
            connect=None,
            sock_connect=min(timeout_s, CONNECT_TIMEOUT_CAP_S),
            sock_read=timeout_s,
        )

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self.max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            timeout=self._timeout,
            proxy=_env_proxy(self.base_url),
            cookie_jar=aiohttp.DummyCookieJar(),  # an API client keeps no cookies
        )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        data: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> bytes:
        """The body of a 2xx response to ``method url``.

        Raises :class:`APIStatusError` (its subclass by status) for any other
        status, :class:`APITimeoutError` when no response came in time and
        :class:`APIConnectionError` when the connection failed.
        """
        session = self._session or self._open()
        timeout = self._timeout if timeout_s is None else self._client_timeout(timeout_s)
        seconds = self.timeout_s if timeout_s is None else timeout_s
        answered = False  # the status line and headers are in; the body may not be
        try:
            async with (
                self._slots,  # entered first: the clock starts once a connection is free
                asyncio.timeout(seconds),
                session.request(
                    method,
                    url,
                    data=data,
                    headers=headers,
                    timeout=timeout,
                    allow_redirects=False,  # a POST must not silently turn into a GET
                ) as response,
            ):
                answered = True
                content = await response.read()
                status = response.status
                if 200 <= status < 300:
                    return content
                retry_after_s = parse_retry_after(response.headers)
                if retry_after_s is None and status == 429:  # OpenAI names its wait so too
                    retry_after_s = parse_rate_limit_reset(response.headers)
                raise error_from_response(
                    status,
                    content,
                    reason=response.reason,
                    retry_after_s=retry_after_s,
                    location=response.headers.get("Location") if status < 400 else None,
                    secrets=self._secrets,
                )
        except TimeoutError as exc:  # aiohttp's timeouts subclass it (so does asyncio's)
            if isinstance(exc, aiohttp.ConnectionTimeoutError):
                what = f"could not connect within {timeout.sock_connect} s"
            elif answered:
                what = f"response body not complete within {seconds} s"
            else:
                what = f"no response within {seconds} s"
            raise APITimeoutError(self._redacted(f"{method} {url}: {what}")) from exc
        except aiohttp.ClientError as exc:
            raise APIConnectionError(
                self._redacted(f"{method} {url}: {type(exc).__name__}: {exc}")
            ) from exc

    def _redacted(self, message: str) -> str:
        # a key in the URL (some gateways take ?api-key=) must not reach the record either
        return redact_url_credentials(self.redactor.text(message))

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
