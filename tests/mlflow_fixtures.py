"""A real ``mlflow server`` on loopback with S3 artifacts on moto, for tracking tests.

The fixture reaches every test through ``pytest_plugins`` in ``tests/conftest.py``: take
it as an argument, do not import it (helpers such as :func:`fake_aws_env` are imported).

``mlflow_server`` (module scope) starts ``mlflow server`` as a subprocess in its own
process group (job execution disabled: 2 processes, healthy in seconds), with an SQLite
backend store in a temporary folder and ``--artifacts-destination s3://<bucket>/mlflow``
on the session's moto server and one worker, waits for ``/health``, yields its URL and kills the
process group it started afterwards. The server gets the fake AWS credentials of
``tests.s3_fixtures``; clients reach artifacts through the server's proxy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.processes import stop_process_group
from tests.s3_fixtures import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, FAKE_SESSION_TOKEN, REGION
from vfops._net import free_port

MLFLOW = str(Path(sys.executable).parent / "mlflow")


def fake_aws_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_ACCESS_KEY,
        "AWS_SESSION_TOKEN": FAKE_SESSION_TOKEN,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": "/nonexistent/vfops-test-aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/vfops-test-aws-credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
        "MLFLOW_S3_ENDPOINT_URL": endpoint,
    }


def _create_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.session.Session(
        aws_access_key_id=FAKE_ACCESS_KEY_ID,
        aws_secret_access_key=FAKE_SECRET_ACCESS_KEY,
        aws_session_token=FAKE_SESSION_TOKEN,
    ).client("s3", endpoint_url=endpoint, region_name=REGION)
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()


class MlflowServer:
    def __init__(self, url: str, bucket: str, endpoint: str, log: Path) -> None:
        self.url = url
        self.bucket = bucket
        self.s3_endpoint = endpoint
        self.log = log


@pytest.fixture(scope="module")
def mlflow_server(
    moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MlflowServer]:
    folder = tmp_path_factory.mktemp("mlflow-server")
    bucket = f"vfops-mlflow-{uuid.uuid4().hex[:10]}"
    _create_bucket(moto_endpoint, bucket)
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))},
        **fake_aws_env(moto_endpoint),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    log = folder / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                MLFLOW,
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--backend-store-uri",
                f"sqlite:///{folder / 'mlflow.db'}",
                "--artifacts-destination",
                f"s3://{bucket}/mlflow",
                "--workers",
                "1",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # a safety net for a busy machine
        while True:
            if process.poll() is not None:
                pytest.fail(f"mlflow server exited early:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not healthy in 240 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield MlflowServer(url, bucket, moto_endpoint, log)
    finally:
        stop_process_group(process, grace_s=10)


@dataclass
class Backend:
    """Where a test's MLflow runs go: the embedded store under ``home``, or ``server``."""

    kind: str
    home: Path
    server: MlflowServer | None


@pytest.fixture(params=["embedded", "server"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    """Each test twice: MLflow's embedded store in a fresh ``VFOPS_HOME``, and a real
    ``mlflow server`` with S3 artifacts (the module's :func:`mlflow_server`)."""
    from vfops.registry import dispose_engines

    home = tmp_path / "home"
    monkeypatch.setenv("VFOPS_HOME", str(home))
    for var in (
        "MLFLOW_TRACKING_URI",
        "VFOPS_MLFLOW_ARTIFACTS",
        "VFOPS_TRACKING",
        "OPENAI_API_KEY",
    ):
        monkeypatch.delenv(var, raising=False)
    server: MlflowServer | None = None
    if request.param == "server":
        server = request.getfixturevalue("mlflow_server")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        for key, value in fake_aws_env(server.s3_endpoint).items():
            monkeypatch.setenv(key, value)
    yield Backend(request.param, home, server)
    dispose_engines()
