"""Secrets stay out of every store, and bad arguments stay out of the registry (issue 44,
items 8 and 9).

- An endpoint that echoes the API key back in its completion, URL-encoded, base64
  (alone, URL-safe, inside a basic-auth ``user:key``), JSON-escaped or hex, and the
  ``?api-key=`` of its base URL, leaves no copy of any of them in results.jsonl,
  rollouts.arrow, metadata.json, the registry, MLflow (its database, parquet, traces)
  or the command's output.
- ``user:password@`` in a base URL is sent as basic auth and recorded nowhere; with
  a key set too it is refused in one line; an endpoints file may not carry either.
- ``-a``/``-S`` values no registry can store (NUL, NaN/Infinity) are refused before
  the first request, naming the key path, on SQLite and PostgreSQL.

Model calls go over real HTTP to aiohttp servers on loopback, served by this test's
event loop while ``vfops eval`` runs in a subprocess (``tests.test_bad_input``'s helper);
stores are read back decoded (SQLite cells, Parquet and Arrow tables), not only grepped.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.pool import NullPool

from tests.http_fixtures import loopback_server
from tests.registry_fixtures import DIALECTS, database_url
from tests.test_bad_input import snapshot, vfops
from vfops._plain_json import UnrecordableValueError, check_plain_json
from vfops._redact import REDACTED, Redactor, public_url, redact_url_credentials, url_secrets

KEY = "sk-vfops/echo+Key=0123456789abcdefXYZ"
"""A distinctive key with the characters encoders treat specially (``/ + =``)."""

QUERY_KEY = "qk-gateway-key-9f8e7d6c5b4a"
"""A key a gateway takes in the base URL's query (``?api-key=``)."""

PASSWORD = "basic-auth-password-1234"


def echoed_forms(key: str) -> list[str]:
    """How endpoints (and proxies) echo a key back."""
    raw = key.encode()
    return [
        key,
        quote(key, safe=""),
        quote_plus(key),
        re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quote(key, safe="")),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        base64.b64encode(b"user:" + raw).decode(),  # an Authorization: Basic echoed
        base64.b64encode(orjson.dumps({"api_key": key})).decode(),
        json.dumps(key).replace("/", "\\/")[1:-1],  # a JSON encoder that escapes "/"
        raw.hex(),
    ]


def traces_of(forms: list[str]) -> list[str]:
    """What must be found nowhere: each form, and a 16-character piece of its middle."""
    pieces = [form[len(form) // 4 : len(form) // 4 + 16] for form in forms]
    return [*forms, *pieces]


# --- unit: every form of a key, and URLs


@pytest.mark.parametrize("form", echoed_forms(KEY))
def test_every_echoed_form_of_the_key_is_redacted(form: str) -> None:
    redactor = Redactor([KEY])
    out = redactor.text(f"you sent {form}, thanks")
    assert not [trace for trace in traces_of([form]) if trace in out], out
    assert REDACTED in out and out.startswith("you sent ") and out.endswith(", thanks")


def test_text_without_the_key_is_untouched_and_short_keys_are_no_secret() -> None:
    text_ = "the answer is 4 (a fairly long word: internationalisation)"
    assert Redactor([KEY]).text(text_) == text_
    assert Redactor(["EMPTY"]).text("EMPTY stays") == "EMPTY stays"
    assert not Redactor(["EMPTY"])
    decoded = {"a": [1, f"x {KEY}"], "b": {"c": None, KEY: True}}
    assert Redactor([KEY]).json(decoded) == {
        "a": [1, f"x {REDACTED}"],
        "b": {"c": None, REDACTED: True},
    }


def test_credentials_in_a_url_are_found_and_dropped() -> None:
    url = f"http://user:{PASSWORD}@gw.example:8443/v1?api-version=2024-10&api-key={QUERY_KEY}"
    assert public_url(url) == "http://gw.example:8443/v1?api-version=2024-10"
    assert {PASSWORD, QUERY_KEY} <= set(url_secrets(url))
    for name in ("api_key", "key", "token", "access_token", "sig", "X-Amz-Signature"):
        assert public_url(f"https://h/v1?{name}=s3cr3t&x=1") == "https://h/v1?x=1"
    message = f"GET {url}: no response within 5 s; see https://docs.example/page."
    assert redact_url_credentials(message) == (
        "GET http://gw.example:8443/v1?api-version=2024-10: no response within 5 s; "
        "see https://docs.example/page."
    )


# --- end to end: an endpoint that echoes the key in every form


def _stores(roots: list[Path]) -> Iterator[tuple[Path, str]]:
    """Every file under ``roots`` as text: raw bytes, and decoded where a format hides
    its strings (SQLite pages, compressed Parquet, Arrow buffers)."""
    for root in roots:
        for path in sorted(root.rglob("*")):
            if not path.is_file():
                continue
            yield path, path.read_bytes().decode("utf-8", errors="replace")
            if path.suffix == ".db":
                yield path, _sqlite_cells(path)
            elif path.suffix == ".parquet":
                yield path, orjson.dumps(pq.read_table(path).to_pylist(), default=str).decode()
            elif path.suffix == ".arrow":
                with pa.OSFile(str(path)) as source:
                    table = pa.ipc.open_stream(source).read_all()
                yield path, orjson.dumps(table.to_pylist(), default=str).decode()


def _sqlite_cells(path: Path) -> str:
    database = sqlite3.connect(path)
    try:
        tables = [
            name
            for (name,) in database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        return "\n".join(
            str(cell)
            for table in tables
            for row in database.execute(f'SELECT * FROM "{table}"')
            for cell in row
        )
    finally:
        database.close()


async def _echo_the_key(request: web.Request) -> web.Response:
    """A completion quoting the request's key in every form, and the URL it was sent to."""
    await request.read()
    key = request.headers["Authorization"].removeprefix("Bearer ")
    query_key = request.query.get("api-key", "")
    content = (
        "4. You sent: "
        + " | ".join(echoed_forms(key))
        + f" | to {request.url} | {base64.b64encode(query_key.encode()).decode()}"
    )
    return web.json_response(
        {
            "id": "echo",
            "object": "chat.completion",
            "model": "stub-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 30, "total_tokens": 33},
        }
    )


async def _models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "stub-model"}]})


ECHO_ROUTES = {("POST", "/v1/chat/completions"): _echo_the_key, ("GET", "/v1/models"): _models}


async def test_a_key_echoed_in_any_encoding_is_in_no_store(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    async with loopback_server(ECHO_ROUTES) as base_url:
        done = await asyncio.to_thread(
            vfops,
            ["eval", "arithmetic", "-m", "stub-model", "-b",
             f"{base_url}?api-version=1&api-key={QUERY_KEY}", "-k", "MY_KEY",
             "-n", "2", "-r", "1", "-o", str(out)],
            # MLflow too: its store, artifacts (rollouts.parquet) and a trace per rollout
            tmp_path, {"MY_KEY": KEY, "VFOPS_TRACKING": "1", "VFOPS_TRACE_ROLLOUTS": "all"},
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (results,) = out.rglob("results.jsonl")
    rows = [orjson.loads(line) for line in results.read_bytes().splitlines()]
    completions = [row["completion"][-1]["content"] for row in rows]
    assert len(rows) == 2 and all("You sent" in text_ for text_ in completions), completions
    names = {path.name for path in [*out.rglob("*"), *home.rglob("*")]}
    assert {"results.jsonl", "rollouts.arrow", "metadata.json", "registry.db", "mlflow.db",
            "rollouts.parquet"} <= names, names  # fmt: skip
    forbidden = traces_of([*echoed_forms(KEY), QUERY_KEY])
    leaks = [
        (str(path), trace)
        for path, content in [*_stores([out, home]), (Path("<output>"), done.stdout + done.stderr)]
        for trace in forbidden
        if trace in content
    ]
    assert not leaks, leaks
    assert all(text_.count(REDACTED) >= len(echoed_forms(KEY)) for text_ in completions)
    metadata = orjson.loads(next(out.rglob("metadata.json")).read_bytes())
    assert metadata["base_url"] == f"{base_url}?api-version=1"  # recorded without its key


# --- credentials in a base URL


async def test_user_and_password_in_a_base_url_are_sent_as_basic_auth_and_recorded_nowhere(
    tmp_path: Path,
) -> None:
    seen: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return await _echo_the_key(request)

    (tmp_path / "home").mkdir()
    routes = {**ECHO_ROUTES, ("POST", "/v1/chat/completions"): chat}
    async with loopback_server(routes) as base_url:
        with_credentials = base_url.replace("http://", f"http://user:{PASSWORD}@")
        done = await asyncio.to_thread(
            vfops,
            ["eval", "arithmetic", "-m", "stub-model", "-b", with_credentials, "-n", "1",
             "-r", "1", "-o", str(tmp_path / "out")],
            tmp_path, {},
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    basic = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert seen == [basic]
    leaks = [
        str(path)
        for path, content in [*_stores([tmp_path]), (Path("<output>"), done.stdout + done.stderr)]
        if PASSWORD in content or basic.split()[1][8:24] in content
    ]
    assert not leaks, leaks


def test_credentials_in_a_base_url_next_to_a_key_are_refused_in_one_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "home").mkdir()
    before = snapshot(tmp_path)
    done = vfops(
        ["eval", "arithmetic", "-m", "stub-model", "-b",
         f"http://user:{PASSWORD}@127.0.0.1:9/v1", "-n", "1", "-o", str(tmp_path / "out")],
        tmp_path, {"OPENAI_API_KEY": KEY},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: base URL http://127.0.0.1:9/v1 carries user:password@")
    assert "unset OPENAI_API_KEY" in line
    assert PASSWORD not in done.stdout + done.stderr and KEY not in done.stderr
    assert snapshot(tmp_path) == before


def test_an_endpoints_file_may_not_carry_credentials(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    endpoints = tmp_path / "endpoints.toml"
    endpoints.write_text(
        '[[endpoint]]\nalias = "gw"\nmodel = "m"\n'
        f'base_url = "https://user:{PASSWORD}@gw.example/v1?api-key={QUERY_KEY}"\n'
    )
    done = vfops(["eval", "arithmetic", "-m", "gw", "-e", str(endpoints)], tmp_path, {})
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert "carries credentials (user:password@ and ?api-key=)" in line, line
    assert "api_key_var" in line
    assert PASSWORD not in line and QUERY_KEY not in line


# --- the door: arguments no registry can store


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def _eval_runs(url: str) -> int:
    engine = create_engine(url, poolclass=NullPool)
    try:
        if not inspect(engine).has_table("eval_runs"):
            return 0
        with engine.connect() as connection:
            return int(connection.execute(text("SELECT count(*) FROM eval_runs")).scalar_one())
    finally:
        engine.dispose()


UNSTORABLE = [
    (["-a", '{"num_examples": 2, "system_prompt": "Answer.\\u0000"}'],
     r"^error: env_args\.system_prompt is a string with a NUL character \(\\u0000\).*"
     r"remove the NUL character.*\(-a/--env-args\)$"),
    (["-S", '{"stop": ["</answer>", "\\u0000"]}'],
     r"^error: sampling_args\.stop\[1\] is a string with a NUL.*\(-S/--sampling-args\)$"),
    (["-S", "@{tmp}/sampling.toml"],
     r"^error: sampling_args\.extra_body\.repetition_penalty is a non-finite number \(inf\)"
     r".*pass a finite number.*\(-S/--sampling-args\)$"),
]  # fmt: skip
"""Arguments the environment and the endpoint accept (the run would go ahead), that
no registry can store: PostgreSQL refuses NUL in text and JSONB, and Infinity in JSONB."""


def test_the_check_names_each_unstorable_kind_by_its_key_path() -> None:
    cases = {
        "key": ({"opts\x00": 1}, r"env_args\['opts\\x00'\] is a key with a NUL character"),
        "nan": ({"a": [1.5, float("nan")]}, r"env_args\.a\[1\] is a non-finite number \(nan\)"),
        "surrogate": ({"s": "\ud800"}, r"env_args\.s is a string with a lone surrogate"),
    }
    for value, expect in cases.values():
        with pytest.raises(UnrecordableValueError) as info:
            check_plain_json(value, "env_args", "-a/--env-args")
        assert re.match(expect, str(info.value)), str(info.value)
    check_plain_json({"ok": ["text", 1.5, -(2**63), None, True, {"k": "v"}]}, "env_args", "-a")


@pytest.mark.parametrize(("args", "expect"), UNSTORABLE, ids=["nul-a", "nul-S", "inf-S"])
async def test_an_argument_no_registry_can_store_is_refused_before_any_request(
    tmp_path: Path, db_url: str, args: list[str], expect: str
) -> None:
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "sampling.toml").write_text("[extra_body]\nrepetition_penalty = inf\n")
    chats: list[int] = []

    async def chat(request: web.Request) -> web.Response:
        chats.append(1)
        return await _echo_the_key(request)

    routes = {**ECHO_ROUTES, ("POST", "/v1/chat/completions"): chat}
    before = _eval_runs(db_url), snapshot(tmp_path)
    async with loopback_server(routes) as base_url:
        done = await asyncio.to_thread(
            vfops,
            ["eval", "arithmetic", "-m", "stub-model", "-b", base_url, "-n", "1", "-r", "1",
             "-o", str(tmp_path / "out"), *[arg.replace("{tmp}", str(tmp_path)) for arg in args]],
            tmp_path, {"VFOPS_DATABASE_URL": db_url},
        )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert re.search(expect, line), line
    assert not chats  # before the first request
    assert (_eval_runs(db_url), snapshot(tmp_path)) == before  # nothing recorded or written
