"""Judge re-scoring of registry runs, the model-call budget and the client's limiter hook.

Registry tests run on SQLite and PostgreSQL (tests/registry_fixtures.py); the judge
is a ScriptedClient (no network) except where the HTTP client itself is tested.
Nothing here needs a Prefect server (see test_flow_judge_score.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from tests.registry_fixtures import (
    DIALECTS,
    database_url,
    make_error_record,
    make_record,
    store_rollouts,
    stored_rollouts,
)
from vfops._errors import EndpointError, VfopsError
from vfops._rollout import RolloutError
from vfops._types import Messages
from vfops.budget import (
    Budget,
    LocalRequestLimiter,
    Pacer,
    RequestLimiter,
    budget_for,
    limit_name,
    load_budgets,
    rate_limit_batch,
    rate_limit_name,
)
from vfops.clients import OpenAIClient, RetryPolicy, ScriptedClient
from vfops.judging import (
    JudgeScoreSpec,
    RolloutJudgement,
    artifact_key,
    judge_score_markdown,
    judge_score_table,
    plan_judge_score,
    rescore_run,
)
from vfops.registry import (
    JudgeCacheRow,
    NewRun,
    RegistryJudgeCache,
    create_run,
    get_engine,
    session_scope,
    transaction,
)
from vfops.rubrics import JudgeRubric
from vfops.testing import StubConfig, StubServer


@pytest.fixture(params=DIALECTS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    for url in database_url(request.param, tmp_path):
        yield get_engine(url)


def _make_run(engine: Engine, records: list[Any], run_id: str | None = None) -> str:
    with session_scope(engine) as session:
        run = create_run(
            session,
            NewRun(
                environment_name="arith",
                environment_version="1.0.0",
                environment_content_hash="c" * 64,
                model="test-model",
                num_examples=10,
                rollouts_per_example=2,
                config_fingerprint="fp",
                run_id=run_id,
            ),
        )
        run_id = run.id
    store_rollouts(engine, run_id, records)
    return run_id


def _says_yes_for_even_examples(messages: Messages, tools: Any) -> str:
    # the judge prompt holds the ground-truth answer; example e, rollout r -> answer e + r
    content = str(messages[-1]["content"])
    answer = int(content.split("Ground truth answer:\n```\n", 1)[1].split("\n", 1)[0])
    return "yes" if answer % 2 == 0 else "no, wrong"


def _records(n_examples: int, rollouts: int) -> list[Any]:
    return [make_record(e, r) for e in range(n_examples) for r in range(rollouts)]


def _rubric(client: Any, **kwargs: Any) -> JudgeRubric:
    return JudgeRubric(judge_client=client, judge_model="judge-1", **kwargs)


# --- rescore_run ------------------------------------------------------------------------


async def test_rescore_scores_every_rollout_and_a_rerun_makes_no_judge_call(
    engine: Engine,
) -> None:
    run_id = _make_run(engine, _records(10, 3))
    client = ScriptedClient(_says_yes_for_even_examples)
    rubric = _rubric(client)

    first = await rescore_run(engine, run_id, rubric, max_concurrent=4)
    # answers e + r over e < 10, r < 3: keys differ by prompt and answer, all 30 distinct
    assert len(client.calls) == 30
    assert (first.n_rollouts, first.n_judged, first.n_cached, first.n_errors) == (30, 30, 0, 0)
    expected = sum(1.0 for e in range(10) for r in range(3) if (e + r) % 2 == 0) / 30
    assert first.mean_score == pytest.approx(expected)
    assert first.judgements is not None
    assert [(j.example_id, j.rollout_index) for j in first.judgements] == [
        (e, r) for e in range(10) for r in range(3)
    ]
    assert rubric.cache is None  # the rubric's own cache is restored

    # the verdicts are in the judge cache, with their scores
    with transaction(engine, write=False) as connection:
        rows = connection.execute(
            select(JudgeCacheRow.key, JudgeCacheRow.score, JudgeCacheRow.judge_model)
        ).all()
    assert len(rows) == 30
    by_key = {row.key: row for row in rows}
    for judgement in first.judgements:
        assert judgement.key is not None
        assert by_key[judgement.key].score == judgement.score
        assert by_key[judgement.key].judge_model == "judge-1"

    # a rerun (a new rubric and client, as in another process) makes zero judge calls
    client2 = ScriptedClient(["must not be called"])
    again = await rescore_run(engine, run_id, _rubric(client2), max_concurrent=4)
    assert client2.calls == []
    assert (again.n_judged, again.n_cached, again.n_errors) == (0, 30, 0)
    assert again.mean_score == first.mean_score
    assert again.judgements == [
        RolloutJudgement(j.example_id, j.rollout_index, j.key, j.score, cached=True)
        for j in first.judgements
    ]


async def test_a_changed_template_or_model_is_judged_again(engine: Engine) -> None:
    run_id = _make_run(engine, _records(3, 1))
    client = ScriptedClient(["yes"], cycle=True)
    await rescore_run(engine, run_id, _rubric(client))
    assert len(client.calls) == 3
    other_model = JudgeRubric(judge_client=client, judge_model="judge-2")
    result = await rescore_run(engine, run_id, other_model)
    assert (result.n_judged, len(client.calls)) == (3, 6)
    other_template = _rubric(client, judge_prompt="{question} {answer} {response} yes or no?")
    result = await rescore_run(engine, run_id, other_template)
    assert (result.n_judged, len(client.calls)) == (3, 9)


async def test_cached_reply_without_a_score_gets_one(engine: Engine) -> None:
    run_id = _make_run(engine, _records(2, 1))
    rubric = _rubric(ScriptedClient(["unused"]))
    # an eval-time JudgeRubric stored the replies (text only, no score)
    cache = RegistryJudgeCache(engine, judge_model="judge-1")
    for example in range(2):
        record = make_record(example, 0)
        key = rubric.cache_key(
            str(record.prompt[-1]["content"]), f"<answer>{example}</answer>", record.answer
        )
        await cache.set(key, "yes" if example == 0 else "no")
    result = await rescore_run(engine, run_id, rubric)
    assert (result.n_cached, result.n_judged, result.mean_score) == (2, 0, 0.5)
    assert result.judgements is not None
    entry = await cache.get_entry(str(result.judgements[0].key))
    assert entry is not None and entry.score == 1.0


async def test_failed_judge_requests_are_counted_and_retried_by_a_rerun(engine: Engine) -> None:
    records = [*_records(4, 1), make_error_record(4, 0)]
    records.append(
        make_record(
            5,
            0,
            completion=[],
            reward=None,
            stop_reason="error",
            error=RolloutError(type="APIError", message="boom", stage="generation"),
        )
    )
    run_id = _make_run(engine, records)
    failing = {"1"}

    def judge(messages: Messages, tools: Any) -> str:
        answer = str(messages[-1]["content"]).split("Ground truth answer:\n```\n")[1][0]
        if answer in failing:
            raise ValueError("judge exploded")
        return "yes"

    client = ScriptedClient(judge)
    seen: list[RolloutJudgement] = []
    first = await rescore_run(
        engine, run_id, _rubric(client, max_retries=0), keep_judgements=False,
        on_judgement=seen.append,
    )  # fmt: skip
    # rollout 5 failed while generating: nothing to judge; rollout 4 failed scoring: judged
    assert (first.n_rollouts, first.n_judged, first.n_skipped, first.n_errors) == (6, 4, 1, 1)
    assert first.judgements is None
    assert [j.example_id for j in seen] == [0, 1, 2, 3, 4, 5]
    assert seen[1].error is not None and "judge exploded" in seen[1].error
    assert "example 1 rollout 0: ValueError: judge exploded" in first.errors[0]
    assert first.summary()["n_errors"] == 1

    failing.clear()
    again = await rescore_run(engine, run_id, _rubric(client))
    assert (again.n_judged, again.n_cached, again.n_errors) == (1, 4, 0)
    assert len(client.calls) == 5 + 1


async def test_rescore_streams_with_bounded_concurrency(engine: Engine) -> None:
    run_id = _make_run(engine, _records(60, 1))
    in_flight = peak = 0
    # The first judges wait until five are in flight: on a loaded machine the page
    # reader may otherwise lag, and the peak would measure the reader, not the bound.
    five_in_flight = asyncio.Event()

    async def judge(messages: Messages, tools: Any) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight >= 5:
            five_in_flight.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(five_in_flight.wait(), timeout=10)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return "yes"

    result = await rescore_run(
        engine, run_id, _rubric(ScriptedClient(judge), max_concurrent=64), max_concurrent=5,
        page_size=7, keep_judgements=False,
    )  # fmt: skip
    assert (result.n_judged, result.mean_score) == (60, 1.0)
    assert peak == 5


async def test_unknown_run_is_a_clear_error(engine: Engine) -> None:
    _make_run(engine, _records(1, 1), run_id="abc123")
    with pytest.raises(VfopsError, match="no eval run with id 'nope'"):
        await rescore_run(engine, "nope", _rubric(ScriptedClient(["yes"])))
    result = await rescore_run(engine, "abc", _rubric(ScriptedClient(["yes"])))  # a prefix
    assert result.run_id == "abc123"
    with pytest.raises(VfopsError, match="max_concurrent"):
        await rescore_run(engine, "abc", _rubric(ScriptedClient(["yes"])), max_concurrent=0)


# --- the client's limiter hook ------------------------------------------------------------


class CountingLimiter:
    def __init__(self) -> None:
        self.entered = 0
        self.exited = 0
        self.in_flight = 0

    @asynccontextmanager
    async def _cm(self) -> AsyncIterator[None]:
        self.entered += 1
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self.exited += 1

    def acquire(self) -> Any:
        return self._cm()


async def test_limiter_is_entered_around_every_http_attempt_including_retries() -> None:
    limiter = CountingLimiter()
    assert isinstance(limiter, RequestLimiter)
    config = StubConfig(fail_first_n=2, fail_first_kind="429", retry_after_s=0.0)
    with StubServer(config) as server:
        backoff = RetryPolicy(max_retries=3, base_delay_s=0.0)
        async with OpenAIClient(server.base_url, backoff=backoff, limiter=limiter) as client:
            reply = await client.chat(model="m", messages=[{"role": "user", "content": "hi"}])
            assert reply.message["content"] == "ok"
            assert server.stats["requests"] == 3
            assert (limiter.entered, limiter.exited, limiter.in_flight) == (3, 3, 0)
            # a request that fails for good still leaves the limiter
            failing = StubConfig(fail_first_n=10, fail_first_kind="400")
        with StubServer(failing) as bad:
            async with OpenAIClient(bad.base_url, backoff=backoff, limiter=limiter) as client:
                with pytest.raises(Exception, match="temperature"):
                    await client.chat(model="m", messages=[{"role": "user", "content": "x"}])
    assert (limiter.entered, limiter.exited) == (4, 4)


async def test_judge_through_openai_client_and_local_limiter_on_a_rate_limited_stub(
    engine: Engine,
) -> None:
    run_id = _make_run(engine, _records(12, 1))
    limiter = LocalRequestLimiter(requests_per_s=40, max_concurrent=4)
    with StubServer(StubConfig(rate_limit_per_s=40)) as server:
        client = OpenAIClient(server.base_url, max_retries=2, limiter=limiter)
        rubric = _rubric(client)
        try:
            result = await rescore_run(engine, run_id, rubric, max_concurrent=8)
        finally:
            await rubric.aclose()
        stats = server.stats
    # "ok" is neither yes nor no: every score is 0.0, each stored once
    assert (result.n_judged, result.n_errors, result.mean_score) == (12, 0, 0.0)
    assert stats["429"] == 0 and stats["requests"] == 12 == limiter.acquired


# --- pacing and budgets ---------------------------------------------------------------------


async def test_pacer_spaces_admissions_and_takes_grants_in_batches() -> None:
    grants: list[tuple[float, int]] = []

    async def grant(n: int) -> None:
        grants.append((time.monotonic(), n))

    pacer = Pacer(50.0, batch=5, grant=grant)
    times: list[float] = []

    async def one() -> None:
        await pacer.wait()
        times.append(time.monotonic())

    await asyncio.gather(*(one() for _ in range(12)))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.02 - 1e-3  # never faster than 50/s
    assert len(grants) == 3 and all(n == 5 for _, n in grants)
    # each batch is asked for no earlier than batch / rate after the previous one
    assert grants[1][0] - grants[0][0] >= 0.1 and grants[2][0] - grants[1][0] >= 0.1


async def test_local_limiter_bounds_concurrency_and_rate() -> None:
    limiter = LocalRequestLimiter(max_concurrent=2, requests_per_s=100)
    in_flight = peak = 0

    async def one() -> None:
        nonlocal in_flight, peak
        async with limiter.acquire():
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(10)))
    assert peak == 2 and limiter.acquired == 10
    assert time.monotonic() - started >= 0.05  # 10 requests, 2 at a time, 10 ms each
    with pytest.raises(VfopsError, match="requests_per_s"):
        LocalRequestLimiter(requests_per_s=0)


def test_limit_names() -> None:
    assert limit_name("endpoint", "small") == "vfops-endpoint-small"
    assert limit_name("judge", "openai/GPT-4.1 mini") == "vfops-judge-openai-gpt-4.1-mini"
    assert rate_limit_name("vfops-judge-x") == "vfops-judge-x-rate"
    assert [rate_limit_batch(r) for r in (0.2, 1, 2.5, 20)] == [1, 1, 3, 20]
    with pytest.raises(VfopsError, match="no letters"):
        limit_name("judge", "///")


def test_budgets_file_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "budgets.toml"
    file.write_text(
        "[budget.small]\nmax_concurrent = 8\nrequests_per_s = 5\n\n"
        "[budget.big]\nmax_concurrent = 64\n"
    )
    budgets = load_budgets(file)
    assert budgets["small"] == Budget("small", max_concurrent=8, requests_per_s=5.0)
    assert budgets["big"] == Budget("big", max_concurrent=64)
    assert budget_for("small", budgets_file=file, requests_per_s=2) == Budget("small", 8, 2.0)
    assert budget_for("other", budgets_file=file).unlimited
    monkeypatch.setenv("VFOPS_BUDGETS", str(file))
    assert budget_for("big").max_concurrent == 64
    monkeypatch.delenv("VFOPS_BUDGETS")
    monkeypatch.chdir(tmp_path)  # ./budgets.toml is the default
    assert budget_for("small").requests_per_s == 5.0

    for text, message in [
        ("[budget.x]\nmax_concurrent = 0\n", r"\[budget\.x\]\.max_concurrent: must be >= 1, got 0"),
        ("[budget.x]\nrequests_per_s = -1\n", r"\[budget\.x\]\.requests_per_s: must be > 0"),
        ("[budget.x]\nrpm = 3\n", r"\[budget\.x\]\.rpm: unknown key"),
        ("[budgets.x]\nrequests_per_s = 1\n", r"\[budgets\]: unknown table; did you mean 'budget'"),
        ("[budget.x\n", "invalid TOML"),
    ]:
        file.write_text(text)
        with pytest.raises(VfopsError, match=message):
            load_budgets(file)
    with pytest.raises(VfopsError, match="not found"):
        load_budgets(tmp_path / "missing.toml")


# --- the judge-score plan (the flow's checks) ------------------------------------------------


def test_plan_checks_run_alias_key_and_template(engine: Engine, tmp_path: Path) -> None:
    run_id = _make_run(engine, _records(1, 1))
    endpoints = tmp_path / "endpoints.toml"
    endpoints.write_text(
        '[[endpoint]]\nalias = "judge"\nmodel = "judge-model"\nbase_url = "http://127.0.0.1:9/v1"\n'
        '\n[[endpoint]]\nalias = "remote"\nmodel = "m"\nbase_url = "https://api.example.com/v1"\n'
        'api_key_var = "VFOPS_TEST_UNSET_KEY"\n'
    )
    spec = JudgeScoreSpec(run_id=run_id[:8], judge="judge", endpoints_file=str(endpoints))
    plan = plan_judge_score(spec, engine)
    assert (plan.run_id, plan.judge_model, plan.limit_name) == (
        run_id, "judge-model", "vfops-judge-judge-model"
    )  # fmt: skip
    assert plan.budget.unlimited
    override = spec.model_copy(update={"judge_model": "other", "requests_per_s": 3.0})
    assert plan_judge_score(override, engine).budget.requests_per_s == 3.0

    with pytest.raises(VfopsError, match="no eval run with id 'missing'"):
        plan_judge_score(spec.model_copy(update={"run_id": "missing"}), engine)
    with pytest.raises(EndpointError, match=r"unknown model alias 'nope'.*known aliases: judge"):
        plan_judge_score(spec.model_copy(update={"judge": "nope"}), engine)
    with pytest.raises(EndpointError, match="VFOPS_TEST_UNSET_KEY is not set"):
        plan_judge_score(spec.model_copy(update={"judge": "remote"}), engine)
    with pytest.raises(VfopsError, match="not a valid template"):
        plan_judge_score(spec.model_copy(update={"judge_prompt": "{oops}"}), engine)
    with pytest.raises(EndpointError, match="not found"):
        plan_judge_score(spec.model_copy(update={"endpoints_file": str(tmp_path / "x")}), engine)


async def test_artifact_renderers(engine: Engine, tmp_path: Path) -> None:
    run_id = _make_run(engine, _records(2, 1), run_id="Run_ABC")
    endpoints = tmp_path / "endpoints.toml"
    endpoints.write_text(
        '[[endpoint]]\nalias = "j"\nmodel = "jm"\nbase_url = "http://127.0.0.1:9/v1"\n'
    )
    plan = plan_judge_score(
        JudgeScoreSpec(run_id=run_id, judge="j", endpoints_file=str(endpoints)), engine
    )
    result = await rescore_run(engine, run_id, _rubric(ScriptedClient(["yes"], cycle=True)))
    table = judge_score_table(result, plan)
    assert table[0]["mean_score"] == 1.0 and table[0]["judged"] == 2
    markdown = judge_score_markdown(result, plan)
    assert "| 1.0000 | 2 | 2 | 2 | 0 | 0 | 0 |" in markdown
    assert artifact_key(run_id) == "judge-score-run-abc"


def test_stub_rate_limit_mode_rejects_above_the_window() -> None:
    import urllib.error
    import urllib.request

    with pytest.raises(ValueError, match="at least 1"):
        StubConfig(rate_limit_per_s=0.5)
    with pytest.raises(ValueError, match="in-process"):
        StubServer(StubConfig(rate_limit_per_s=5), subprocess=True).start()
    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}'

    def burst(server: StubServer) -> tuple[list[int], list[float], float]:
        """9 requests one after another: statuses, Retry-After values, seconds taken."""
        statuses: list[int] = []
        retry_after: list[float] = []
        began = time.monotonic()
        for _ in range(9):
            request = urllib.request.Request(
                server.base_url + "/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    statuses.append(response.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
                retry_after.append(float(exc.headers["Retry-After"]))
                exc.close()
        return statuses, retry_after, time.monotonic() - began

    # the window is one second: the burst must fit in it, which a busy machine may not
    # give at the first try (then the burst is a different experiment: try again)
    for _ in range(5):
        with StubServer(StubConfig(rate_limit_per_s=5, rate_limit_burst=1)) as server:
            statuses, retry_after, took_s = burst(server)
            if took_s >= 0.9:
                continue
            assert statuses == [200] * 6 + [429] * 3  # 5 per second + a burst of 1
            assert all(0 < wait <= 1.0 for wait in retry_after)
            stats = server.stats
            assert (stats["429"], stats["rate_limited"], stats["ok"]) == (3, 3, 6)
            assert len(server.admitted_times) == 6
            time.sleep(max(retry_after[-1], 0) + 0.05)
            request = urllib.request.Request(
                server.base_url + "/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200
            return
    pytest.fail(f"9 requests never fitted in the 1 s window (the last took {took_s:.2f} s)")


def test_importing_vfops_budget_and_judging_does_not_import_prefect() -> None:
    code = (
        "import sys, vfops, vfops.budget, vfops.judging; "
        "assert 'prefect' not in sys.modules, 'prefect imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_a_priced_judge_adds_each_call_cost_to_the_rollout_it_scored(
    engine: Engine,
) -> None:
    """Re-scoring a stored run with a priced judge (real HTTP, the stub): each new
    request's cost lands on its rollout's stored cost; a rerun (all cached) adds none."""
    from vfops.costs import Pricing
    from vfops.registry import run_cost

    run_id = _make_run(engine, _records(4, 2))
    with Session(engine) as session:
        before = run_cost(session, run_id)
    with StubServer(StubConfig(reply_mode=lambda _: {"role": "assistant", "content": "yes"})) as s:
        client = OpenAIClient(s.base_url, pricing=Pricing(3.0, 15.0))
        rubric = _rubric(client)
        try:
            first = await rescore_run(engine, run_id, rubric, max_concurrent=4)
            again = await rescore_run(engine, run_id, rubric, max_concurrent=4)
        finally:
            await rubric.aclose()
    assert first.n_judged == 8 and first.cost_usd is not None and first.cost_usd > 0
    assert again.n_cached == 8 and again.cost_usd is None  # no request: no cost
    costs = [r.usage.cost_usd for r in stored_rollouts(engine, run_id)]
    assert all(c is not None and c > 0 for c in costs)
    with Session(engine) as session:
        after = run_cost(session, run_id)
    assert after == pytest.approx((before or 0.0) + first.cost_usd)
    assert sum(c or 0.0 for c in costs) == pytest.approx(after)
    assert first.summary()["cost_usd"] == first.cost_usd  # in the flow's artifacts
