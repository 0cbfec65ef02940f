"""S3 over real HTTP for tests: a moto server on a free loopback port, fake credentials.

The fixtures reach every test through ``pytest_plugins`` in ``tests/conftest.py``: take
them as arguments, do not import them (the fake credentials below are imported)::

    def test_something(s3_uri: str) -> None:  # "s3://<fresh bucket>/artifacts"
        ...

Do not list this module in a test module's ``pytest_plugins`` too: pytest registers a
plugin only once (a second listing after an import is a PytestAssertRewriteWarning, an
error here).

``moto_endpoint`` (session scope) runs one ``ThreadedMotoServer`` for the whole session
and shuts it down (and closes its listening socket) at the end. ``s3_uri`` (function
scope) points ``VFOPS_S3_ENDPOINT_URL`` at it, replaces every AWS credential source with
the fake values below via ``monkeypatch`` (so a developer's real ``~/.aws`` is never
read), and creates a fresh bucket per test. Nothing leaks into other tests.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

FAKE_ACCESS_KEY_ID = "testing-fake-key-AKIAFAKE0000"
FAKE_SECRET_ACCESS_KEY = "testing-fake-secret-wJalrXUtnFEMI0000"
FAKE_SESSION_TOKEN = "testing-fake-session-token-0000"
REGION = "us-east-1"

_AWS_VARS_TO_CLEAR = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server running in a thread."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO; keep test output readable.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()  # shuts the serve loop down and joins the server thread
        # moto 5.2 + werkzeug 3.1 already close the listening socket in stop(); closing it
        # again is a no-op there, and guards against versions that leave it open (an
        # unclosed-socket ResourceWarning would be an error in this suite).
        wsgi_server = getattr(server, "_server", None)
        if wsgi_server is not None:
            wsgi_server.server_close()


@pytest.fixture
def aws_fake_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Fake AWS credentials and ``VFOPS_S3_ENDPOINT_URL`` for one test; returns the endpoint."""
    for var in _AWS_VARS_TO_CLEAR:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", FAKE_SESSION_TOKEN)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/vfops-test-aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/vfops-test-aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("VFOPS_S3_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint


@pytest.fixture
def s3_bucket(aws_fake_env: str) -> str:
    """A freshly created, empty bucket on the moto server."""
    import boto3

    bucket = f"vfops-test-{uuid.uuid4().hex[:12]}"
    client = boto3.session.Session().client("s3", endpoint_url=aws_fake_env, region_name=REGION)
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()
    return bucket


@pytest.fixture
def s3_uri(s3_bucket: str) -> str:
    """``s3://<fresh bucket>/artifacts``, with the endpoint and fake credentials in the env."""
    return f"s3://{s3_bucket}/artifacts"
