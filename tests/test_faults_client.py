"""Faults at the model client (issue 25: 3, 9, 10, 11), through real components.

- A request that never gets its answer is an error of the rollout (recorded with its
  type, stage and message, never scored; the run exits 3), distinct from an
  environment's own turn/rollout deadline (stop reason ``timeout``); and a hung
  endpoint costs a request about twice the timeout, not ``max_retries + 1`` times it.
- The API key an endpoint echoes back in a 401 is recorded nowhere.
- A ``verifiers`` environment's request carries ``verifiers``' own sampling
  normalisation (``max_completion_tokens``, not ``max_tokens``).
- A cost cap that refuses a request whose length it had to assume names ``-t``.

Model calls go over real HTTP to the stub server on loopback; ``vfops eval`` runs in a
subprocess with its own home (SQLite registry) via ``tests.test_bad_input``'s helper.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.test_bad_input import vfops
from tests.verifiers_reference import verifiers_outputs
from tests.verifiers_stub import reply
from vfops.clients import APITimeoutError, OpenAIClient, RetryPolicy, redact_secrets
from vfops.clients._errors import MAX_MESSAGE_CHARS, REDACTED, error_from_response
from vfops.envs import SingleTurnEnv
from vfops.envs._dataset import Example
from vfops.testing import StubConfig, StubServer

NEVER_ANSWERS = StubConfig(rate_timeout=1.0)
"""Every chat request hangs (an hour) until the client hangs up; ``/models`` answers."""

KEY = "sk-vfops-test-3f9a1c7e5b2d4a6f8e0c1b3d5f7a9c2e"
"""A distinctive fake key: any trace of it in a record is a leak."""


def _run_dir(tmp: Path) -> Path:
    (metadata,) = (tmp / "out").rglob("metadata.json")
    return metadata.parent


def _rows(tmp: Path) -> list[dict[str, Any]]:
    lines = (_run_dir(tmp) / "results.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines]


def _home(tmp: Path) -> Path:
    home = tmp / "home"
    home.mkdir()
    return home


# --- 3: a request timeout is the rollout's error, an environment's timeout a stop reason


def _example() -> Example:
    return Example(example_id=0, prompt=[{"role": "user", "content": "2 + 2"}], answer="4")


def _env(**kwargs: Any) -> SingleTurnEnv:
    return SingleTurnEnv(eval_dataset=[{"question": "2 + 2", "answer": "4"}], **kwargs)


async def test_a_request_timeout_is_a_generation_error_not_a_timeout_stop() -> None:
    with StubServer(NEVER_ANSWERS) as stub:
        async with OpenAIClient(stub.base_url, timeout_s=0.1, max_retries=0) as client:
            state = await _env().rollout(client, "stub-model", _example())
    assert state["stop_reason"] == "error"
    error = state["error"]
    assert error is not None
    assert (error.type, error.stage) == ("APITimeoutError", "generation")
    assert "no response within 0.1 s" in error.message
    assert not isinstance(APITimeoutError("x"), TimeoutError)  # what environments catch
    assert isinstance(APITimeoutError("x"), ConnectionError)  # still transient


async def test_an_environments_own_timeout_stays_a_stop_reason() -> None:
    env = _env(timeout_seconds=0.05)  # far below the request timeout
    with StubServer(NEVER_ANSWERS) as stub:
        async with OpenAIClient(stub.base_url, timeout_s=60.0) as client:
            state = await env.rollout(client, "stub-model", _example())
    assert state["stop_reason"] == "timeout"
    assert state.get("error") is None


async def test_a_timeout_is_retried_twice_by_default_other_faults_up_to_max_retries() -> None:
    with StubServer(NEVER_ANSWERS) as stub:
        async with OpenAIClient(stub.base_url, timeout_s=0.1) as client:  # max_retries 5
            with pytest.raises(APITimeoutError) as info:
                await client.chat(model="m", messages=[{"role": "user", "content": "hi"}])
    assert str(info.value).endswith(
        "; timed out 3 times (a request that times out is retried at most 2 times)"
    )
    with StubServer(NEVER_ANSWERS) as stub:
        policy = RetryPolicy(max_timeout_retries=1, base_delay_s=0.001)
        async with OpenAIClient(stub.base_url, timeout_s=0.1, backoff=policy) as client:
            with pytest.raises(APITimeoutError) as info:
                await client.chat(model="m", messages=[{"role": "user", "content": "hi"}])
    message = str(info.value)
    assert message.endswith("; timed out 2 times (a request that times out is retried once)")
    # 5xx are still retried max_retries times
    with StubServer(StubConfig(fail_first_n=3, fail_first_kind="500")) as stub:
        async with OpenAIClient(stub.base_url, timeout_s=5.0, max_retries=3) as client:
            response = await client.chat(model="m", messages=[{"role": "user", "content": "hi"}])
        assert response.message["role"] == "assistant" and stub.stats["500"] == 3


def test_a_hung_endpoint_errors_every_rollout_and_the_run_exits_3(tmp_path: Path) -> None:
    """The bar of issue 25 #3: ``vfops eval ... --request-timeout`` against an endpoint
    that never answers records every rollout as an error of generation (reward None,
    not scored), and the run exits 3 (completed_with_errors), with the defaults'
    retries (max_retries 5) giving up after the third timeout."""
    _home(tmp_path)
    with StubServer(NEVER_ANSWERS) as stub:
        done = vfops(
            ["eval", "arithmetic", "-m", "stub-model", "-b", stub.base_url, "-n", "2",
             "-r", "2", "--request-timeout", "0.2", "-o", str(tmp_path / "out"), "-q"],
            tmp_path, {},
        )  # fmt: skip
        sent = stub.stats["timeout"]
    assert done.returncode == 3, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: completed with errors: 4 of 4 rollouts"), line
    assert "generation:APITimeoutError" in line
    # nothing was scored: the summary shows no reward, not a 0.0000 that reads as one
    assert re.search(r"\n  reward +none \(no rollout was scored\)\n", done.stdout), done.stdout
    rows = _rows(tmp_path)
    assert len(rows) == 4
    for row in rows:
        assert row["stop_reason"] == "error" and row["reward"] is None, row
        error = row["error"]
        assert (error["type"], error["stage"]) == ("APITimeoutError", "generation")
        assert "no response within 0.2 s; timed out 3 times" in error["message"]
    assert sent <= 4 * 3  # three attempts per request, not max_retries + 1 = 6
    summary = json.loads((_run_dir(tmp_path) / "metadata.json").read_text())["summary"]
    assert summary["errors"] == 4 and summary["scored"] == 0


# --- 9: the key an endpoint echoes back is recorded nowhere


def test_redact_secrets_removes_the_key_and_pieces_of_it() -> None:
    assert redact_secrets(f"Incorrect API key provided: Bearer {KEY}", [KEY]) == (
        f"Incorrect API key provided: Bearer {REDACTED}"
    )
    assert KEY not in redact_secrets(f"GET https://h/v1?api-key={KEY}&x=1", [KEY])
    truncated = f"key {KEY[:20]}… was refused; tail {KEY[-14:]}"
    assert redact_secrets(truncated, [KEY]) == f"key {REDACTED}… was refused; tail {REDACTED}"
    assert redact_secrets("short words stay: sk-vfops and test", [KEY]) == (
        "short words stay: sk-vfops and test"
    )
    assert redact_secrets("EMPTY is no secret", ["EMPTY"]) == "EMPTY is no secret"


def test_an_error_cut_to_length_keeps_no_piece_of_the_key() -> None:
    message = "x" * (MAX_MESSAGE_CHARS - 30) + f" Bearer {KEY} trailing text"
    body = orjson.dumps({"error": {"message": message, "code": "invalid_api_key"}})
    exc = error_from_response(401, body, secrets=[KEY])
    assert KEY[:12] not in str(exc) and KEY[:12] not in orjson.dumps(exc.body).decode()
    assert REDACTED in str(exc)


def test_a_key_echoed_in_a_401_is_recorded_nowhere(tmp_path: Path) -> None:
    home = _home(tmp_path)
    config = StubConfig(api_key="the-right-key-0123456789", echo_key_in_401=True)
    with StubServer(config) as stub:
        done = vfops(
            ["eval", "arithmetic", "-m", "stub-model", "-b", stub.base_url, "-k", "MY_KEY",
             "-n", "2", "-r", "1", "-o", str(tmp_path / "out")],
            # MLflow too (its store, artifacts and a trace per rollout) is scanned below
            tmp_path, {"MY_KEY": KEY, "VFOPS_TRACKING": "1", "VFOPS_TRACE_ROLLOUTS": "all"},
        )  # fmt: skip
        assert stub.stats["401"] >= 2  # the key was sent, and echoed back
    assert done.returncode != 0, done.stdout + done.stderr
    assert KEY not in done.stdout + done.stderr
    assert KEY[:16] not in done.stdout + done.stderr
    assert list(home.rglob("mlflow.db")) and list(home.rglob("rollouts.parquet"))
    rows = _rows(tmp_path)
    messages = [row["error"]["message"] for row in rows]
    assert all(f"Bearer {REDACTED}" in message for message in messages), messages
    for path in [*(tmp_path / "out").rglob("*"), *home.rglob("*")]:
        # results.jsonl, rollouts.arrow, metadata.json, registry.db, mlflow.db, artifacts
        if path.is_file():
            data = path.read_bytes()
            assert KEY.encode() not in data and KEY[:16].encode() not in data, path
    database = sqlite3.connect(home / "registry.db")
    try:
        tables = [
            name
            for (name,) in database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        cells = [
            str(cell)
            for table in tables
            for row in database.execute(f'SELECT * FROM "{table}"')
            for cell in row
        ]
        recorded = database.execute("SELECT error_type, error_message FROM rollouts").fetchall()
    finally:
        database.close()
    assert len(recorded) == 2
    assert all(kind == "AuthenticationError" and REDACTED in text for kind, text in recorded)
    assert not [cell for cell in cells if KEY in cell or KEY[:16] in cell]


# --- 10: verifiers' own sampling normalisation on the request


def test_a_verifiers_environment_sends_verifiers_normalised_sampling_args(
    tmp_path: Path,
) -> None:
    """``-t 64`` reaches the endpoint as verifiers' own client sends it: the reference
    is the body verifiers' ``OpenAIChatCompletionsClient`` posts for the same
    environment and ``max_tokens`` (its ``normalize_sampling_args``)."""
    _home(tmp_path)
    with StubServer(StubConfig(reply_mode=reply, record_requests=True)) as stub:
        done = vfops(
            ["eval", "vf_xml_math", "-m", "stub-model", "-b", stub.base_url, "-n", "1",
             "-r", "1", "-t", "64", "--no-tracking", "-o", str(tmp_path / "out"), "-q"],
            tmp_path, {},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (sent,) = stub.requests
        stub.requests.clear()
        verifiers_outputs(
            "vf_xml_math", stub.base_url, num_examples=1, rollouts_per_example=1,
            sampling_args={"max_tokens": 64},
        )  # fmt: skip
        (reference,) = stub.requests

    def sampling(body: dict[str, Any]) -> dict[str, Any]:
        # n=1 is every endpoint's default: vfops leaves it out (some servers refuse n)
        return {
            k: v for k, v in body.items() if k not in ("messages", "model") and (k, v) != ("n", 1)
        }

    assert sampling(sent) == sampling(reference)
    assert sent["max_completion_tokens"] == 64 and "max_tokens" not in sent
    assert sent["messages"] == reference["messages"]


# --- 11: a cap that had to assume the completion length says -t would bound it

PRICES = "input_price_per_mtok = 2.0\noutput_price_per_mtok = 8.0\n"


def _priced(tmp: Path, base_url: str) -> Path:
    path = tmp / "endpoints.toml"
    path.write_text(
        f'[[endpoint]]\nalias = "priced"\nmodel = "stub-model"\nbase_url = "{base_url}"\n' + PRICES
    )
    return path


def test_a_cap_refusing_an_assumed_length_names_max_tokens(tmp_path: Path) -> None:
    """Without -t (and the environment's own max_tokens unset) each request reserves
    4,096 completion tokens ($0.033 at $8/Mtok):
    a $0.005 cap refuses the first one at $0 spent and says -t would let it run, and
    with -t 32 the same cap runs; a refusal with -t set does not suggest it."""
    _home(tmp_path)
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        endpoints = _priced(tmp_path, stub.base_url)

        def capped(cap: str, *flags: str) -> Any:
            return vfops(
                ["eval", "arithmetic", "-m", "priced", "-e", str(endpoints), "-n", "2",
                 "-r", "1", "-a", '{"max_tokens": null}', "--max-cost", cap, *flags,
                 "-o", str(tmp_path / "out"), "-q"],
                tmp_path, {},
            )  # fmt: skip

        assumed = capped("0.005")
        bounded = capped("0.005", "-t", "32")
        too_small = capped("0.00001", "-t", "32")
    assert assumed.returncode == 5, assumed.stderr
    problem = assumed.stderr.strip().splitlines()[-1]
    assert "$0.0000 spent" in problem
    assert "assumes 4,096 completion tokens without -t" in problem, problem
    assert "set -t/--max-tokens to reserve less, or raise --max-cost" in problem
    assert bounded.returncode == 0, bounded.stderr
    assert too_small.returncode == 5, too_small.stderr
    refused = too_small.stderr.strip().splitlines()[-1]
    assert "cost cap" in refused and "-t/--max-tokens" not in refused, refused
