"""What runs cost, and caps that hold (issue: costs, budgets, adaptive concurrency).

Real components: the stub endpoint over HTTP, the registry on SQLite and PostgreSQL,
``vfops eval`` in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from tests.registry_fixtures import DIALECTS, database_url
from vfops._rollout import TokenUsage
from vfops.clients import OpenAIClient
from vfops.clients._base import ChatResponse
from vfops.clients._openai import parse_chat_completion
from vfops.costs import Pricing, format_cost, prompt_tokens_bound
from vfops.costs._pricing import MESSAGE_OVERHEAD_TOKENS
from vfops.registry import (
    get_cost_budget,
    get_engine,
    reserve_cost,
    run_cost,
    session_scope,
    set_cost_caps,
    settle_cost,
)
from vfops.rubrics import JudgeRubric
from vfops.testing import StubConfig, StubServer

PRICES = "input_price_per_mtok = 2.0\noutput_price_per_mtok = 8.0\n"


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def endpoints_file(tmp_path: Path, base_url: str, prices: str = PRICES) -> Path:
    path = tmp_path / "endpoints.toml"
    path.write_text(
        f'[[endpoint]]\nalias = "priced"\nmodel = "stub-model"\nbase_url = "{base_url}"\n' + prices
    )
    return path


def vfops(*args: str, db_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "VFOPS_HOME": str(tmp_path / "home"),
        "VFOPS_DATABASE_URL": db_url,
        "VFOPS_TRACKING": "0",
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "vfops", *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip


# --- prices ------------------------------------------------------------------------


def test_a_call_costs_its_usage_at_the_endpoint_prices_cached_tokens_at_theirs() -> None:
    pricing = Pricing(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    # 1000 prompt tokens of which 400 cached, 100 completion tokens
    assert pricing.cost(1000, 100, 400) == pytest.approx((600 * 2 + 400 * 0.5 + 100 * 8) / 1e6)
    assert Pricing(2.0, 8.0).cost(1000, 100, 400) == pytest.approx((1000 * 2 + 100 * 8) / 1e6)
    body = orjson.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": "x"}}],
            "usage": {
                "prompt_tokens": 1000,
                "completion_tokens": 100,
                "prompt_tokens_details": {"cached_tokens": 400},
            },
        }
    )
    assert parse_chat_completion(body).cached_tokens == 400
    assert format_cost(None) == "unpriced" and format_cost(0.0123) == "$0.0123"


def test_the_prompt_bound_is_never_below_what_a_byte_level_tokenizer_counts() -> None:
    """A byte-level BPE tokenizer (trained here; GPT/Llama/Qwen's kind) on multi-byte
    text: its count of each message's tokens never exceeds the bound. A bound on
    characters instead of UTF-8 bytes would fail (emoji and umlauts are several bytes)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(["What is 17 + 23? Put the answer in tags."] * 50, trainer)
    contents = [
        "Solve it. Put the answer in <answer></answer>.",
        "Zürich: 17 × 23 = ? 🙂🙂🙂 ñandú " * 20,
        "🙂" * 64,
    ]
    for content in contents:
        messages = [{"role": "user", "content": content}]
        tokens = len(tokenizer.encode(content).ids)
        assert tokens <= prompt_tokens_bound(messages), content[:20]
    assert len(tokenizer.encode("🙂" * 64).ids) > 64 + MESSAGE_OVERHEAD_TOKENS  # chars too few


async def test_judge_calls_are_charged_to_the_rollout_they_scored() -> None:
    """Each rollout's cost gains exactly the cost of the judge call that scored it."""
    seen: list[ChatResponse] = []

    class Recording(OpenAIClient):
        async def chat(self, **kwargs: Any) -> ChatResponse:
            response = await super().chat(**kwargs)
            seen.append(response)
            return response

    with StubServer(StubConfig(reply_mode=lambda _: {"role": "assistant", "content": "yes"})) as s:
        judge = Recording(s.base_url, pricing=Pricing(2.0, 8.0))

        async def judged(judge: Any, prompt: Any, completion: Any, answer: Any) -> float:
            return 1.0 if "yes" in await judge(prompt, completion, answer) else 0.0

        rubric = JudgeRubric(judge_client=judge, judge_model="stub-model", funcs=[judged])
        states = [
            {
                "prompt": [{"role": "user", "content": f"question {i} " * (i + 1)}],
                "completion": [{"role": "assistant", "content": "an answer"}],
                "answer": str(i),
                "info": {},
                "task": "default",
                "usage": TokenUsage(),
            }
            for i in range(4)
        ]
        try:
            scores = await rubric.score_group(states)
        finally:
            await rubric.aclose()
    assert [score.reward for score in scores] == [1.0] * 4
    assert len(seen) == 4 and all(r.cost_usd and r.cost_usd > 0 for r in seen)
    charged = sorted(state["usage"].cost_usd for state in states)
    assert charged == sorted(r.cost_usd for r in seen)
    assert len(set(charged)) == 4  # prompts of different lengths: each got its own call's


# --- the ledger ----------------------------------------------------------------------


def test_a_reservation_holds_room_until_it_is_settled_at_the_real_cost(db_url: str) -> None:
    engine = get_engine(db_url)
    with session_scope(engine) as session:
        set_cost_caps(session, {"team": 1.0})
    with session_scope(engine) as session:
        assert reserve_cost(session, "a", ["team"], 0.6, run_id=None) is None
    with session_scope(engine) as session:  # 0.6 held: 0.5 more does not fit
        full = reserve_cost(session, "b", ["team"], 0.5, run_id=None)
        assert full is not None and full.reserved_usd == pytest.approx(0.6)
    with session_scope(engine) as session:
        settle_cost(session, "a", ["team"], 0.25)  # it cost less than its worst case
    with session_scope(engine) as session:
        assert reserve_cost(session, "b", ["team"], 0.5, run_id=None) is None
        budget = get_cost_budget(session, "team")
    assert budget is not None
    assert (budget.spent_usd, budget.reserved_usd) == (pytest.approx(0.25), pytest.approx(0.5))


_RESERVER = textwrap.dedent(
    """
    import sys, uuid
    from vfops.registry import get_engine, reserve_cost, session_scope, settle_cost
    engine = get_engine(sys.argv[1])
    granted = 0
    while True:
        rid = uuid.uuid4().hex
        with session_scope(engine) as session:
            full = reserve_cost(session, rid, ["shared", sys.argv[2]], 0.01, run_id=None)
        if full is not None and full.spent_usd + 0.01 > (full.cap_usd or 0) + 1e-9:
            break
        if full is None:
            granted += 1
            with session_scope(engine) as session:
                settle_cost(session, rid, ["shared", sys.argv[2]], 0.01)
    print(granted)
    """
)


def test_processes_sharing_a_cap_together_spend_at_most_the_cap(db_url: str) -> None:
    """Four processes reserve and settle $0.01 at a time against one $1 cap (and each
    against its own uncapped scope): exactly 100 requests are granted in all."""
    engine = get_engine(db_url)
    with session_scope(engine) as session:
        set_cost_caps(session, {"shared": 1.0, **{f"own-{i}": None for i in range(4)}})
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _RESERVER, db_url, f"own-{i}"], stdout=subprocess.PIPE, text=True
        )
        for i in range(4)
    ]
    granted = [int(w.communicate(timeout=240)[0].strip() or 0) for w in workers]
    assert all(w.returncode == 0 for w in workers)
    assert sum(granted) == 100, granted
    with session_scope(engine) as session:
        shared = get_cost_budget(session, "shared")
        own = [get_cost_budget(session, f"own-{i}") for i in range(4)]
    assert shared is not None and shared.spent_usd == pytest.approx(1.0)
    assert shared.reserved_usd == pytest.approx(0.0, abs=1e-9)
    assert [b.spent_usd for b in own if b] == pytest.approx([g * 0.01 for g in granted])


# --- vfops eval --max-cost -------------------------------------------------------------


def _registry_facts(db_url: str, run_id: str) -> dict[str, Any]:
    engine = get_engine(db_url)
    with engine.connect() as connection:
        status, summary = connection.execute(
            text("SELECT status, summary FROM eval_runs WHERE id = :id"), {"id": run_id}
        ).one()
        rows, distinct = connection.execute(
            text(
                "SELECT count(*), count(DISTINCT example_id * 10 + rollout_index) "
                "FROM rollouts WHERE run_id = :id"
            ),
            {"id": run_id},
        ).one()
    with Session(engine) as session:
        spent = run_cost(session, run_id)
        budget = get_cost_budget(session, f"run:{run_id}")
    if isinstance(summary, str):
        summary = json.loads(summary)
    return {
        "status": status, "summary": summary, "rows": rows, "distinct": distinct,
        "rollout_cost": spent, "budget": budget,
    }  # fmt: skip


def test_a_capped_eval_stops_within_the_cap_and_resume_without_it_finishes(
    db_url: str, tmp_path: Path
) -> None:
    """The bar: 1,000 rollouts capped at about half their full cost stop with status
    budget_exhausted, having spent at most the cap plus one request's reservation;
    --resume with no cap finishes to exactly N x R, and the run's cost is the sum
    over its rollouts (the same as the uncapped run's)."""
    args = ["eval", "arithmetic", "-m", "priced", "-n", "500", "-r", "2", "-t", "32", "-c", "32"]
    with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=5)) as stub:
        endpoints = endpoints_file(tmp_path, stub.base_url)
        common = [*args, "-e", str(endpoints), "-o", str(tmp_path / "out"), "-q"]
        full = vfops(*common, db_url=db_url, tmp_path=tmp_path)
        assert full.returncode == 0, full.stderr
        full_id = full.stdout.split("run: ")[1].split()[0]
        full_cost = _registry_facts(db_url, full_id)["rollout_cost"]
        assert full_cost is not None and full_cost > 0
        cap = round(full_cost / 2, 6)

        capped = vfops(*common, "--max-cost", str(cap), db_url=db_url, tmp_path=tmp_path)
        assert capped.returncode == 5, capped.stderr
        problem = capped.stderr.strip().splitlines()[-1]
        assert "cost cap" in problem and "--resume" in problem and "--max-cost" in problem
        run_id = capped.stdout.split("run: ")[1].split()[0]
        assert run_id != full_id
        stopped = _registry_facts(db_url, run_id)
        assert stopped["status"] == "budget_exhausted"
        budget = stopped["budget"]
        assert budget is not None and budget.cap_usd == pytest.approx(cap)
        one_reservation = Pricing(2.0, 8.0).worst_case(200, 32)  # prompts are < 200 bytes
        assert budget.spent_usd <= cap + one_reservation
        assert budget.reserved_usd == pytest.approx(0.0, abs=1e-12)  # nothing left held
        assert 0 < stopped["rows"] < 1000
        assert stopped["rollout_cost"] <= budget.spent_usd + 1e-12  # recorded <= spent
        assert budget.spent_usd > cap / 2  # it used the budget, not stopped at once

        resumed = vfops(*common, "--resume", run_id, db_url=db_url, tmp_path=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
    done = _registry_facts(db_url, run_id)
    assert done["status"] == "completed"
    assert done["rows"] == done["distinct"] == 1000
    assert done["summary"]["cost_usd"] == pytest.approx(done["rollout_cost"])
    assert done["rollout_cost"] == pytest.approx(full_cost)
    assert "cost" in resumed.stdout and format_cost(done["rollout_cost"]) in resumed.stdout


def test_cost_caps_refuse_what_cannot_be_capped(db_url: str, tmp_path: Path) -> None:
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        unpriced = endpoints_file(tmp_path, stub.base_url, prices="")
        base = ["eval", "arithmetic", "-m", "priced", "-n", "2", "-r", "1", "-q"]
        cases = {
            "needs prices": [*base, "-e", str(unpriced), "--max-cost", "1"],
            "positive number of USD": [*base, "-e", str(unpriced), "--max-cost", "-1"],
            "needs the registry": [*base, "-e", str(unpriced), "--max-cost", "1", "--no-registry"],
        }
        for expected, argv in cases.items():
            done = vfops(*argv, "-o", str(tmp_path / "out"), db_url=db_url, tmp_path=tmp_path)
            assert done.returncode == 2, (expected, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and expected in lines[0], (expected, done.stderr)
        with get_engine(db_url).connect() as connection:  # nothing half-written
            assert connection.execute(text("SELECT count(*) FROM eval_runs")).scalar_one() == 0
    one_price = endpoints_file(tmp_path, "http://127.0.0.1:9/v1", prices=PRICES.split("\n")[0])
    done = vfops(*base, "-e", str(one_price), db_url=db_url, tmp_path=tmp_path)
    assert done.returncode == 2 and "output_price_per_mtok" in done.stderr, done.stderr


def test_runs_cost_breaks_the_spend_down_and_says_unpriced(db_url: str, tmp_path: Path) -> None:
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        priced = endpoints_file(tmp_path, stub.base_url)
        for sampling in ("0", "0.5"):
            done = vfops(
                "eval", "arithmetic", "-m", "priced", "-e", str(priced), "-n", "4", "-r", "2",
                "-T", sampling, "-q", "-o", str(tmp_path / "out"), db_url=db_url, tmp_path=tmp_path,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        done = vfops(
            "eval", "arithmetic", "-m", "stub-model", "-b", stub.base_url, "-n", "2", "-r", "1",
            "-q", "-o", str(tmp_path / "out"), db_url=db_url, tmp_path=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0 and "unpriced" in done.stdout, done.stdout
    engine = get_engine(db_url)
    with engine.connect() as connection:
        ids = connection.execute(text("SELECT id FROM eval_runs")).scalars().all()
    with Session(engine) as session:
        costs = [run_cost(session, i) for i in ids]
    priced_total = sum(c for c in costs if c is not None)
    assert sorted(c is None for c in costs) == [False, False, True]
    table = vfops("runs", "cost", "--by", "model", db_url=db_url, tmp_path=tmp_path)
    assert table.returncode == 0, table.stderr
    total_line = next(line for line in table.stdout.splitlines() if "total" in line)
    assert format_cost(priced_total) in total_line and "│ 1 " in total_line.replace("  ", " ")
    per_run = vfops("runs", "cost", "--by", "run", db_url=db_url, tmp_path=tmp_path)
    assert per_run.stdout.count("│ unpriced ") == 1, per_run.stdout
    bad = vfops("runs", "cost", "--by", "week", db_url=db_url, tmp_path=tmp_path)
    assert bad.returncode == 2 and "--by must be one of" in bad.stderr


def test_an_unpriced_run_has_no_cost_never_zero() -> None:
    usage = TokenUsage()
    usage.add_cost(None)
    assert usage.cost_usd is None
    usage.add_cost(0.5)
    usage.add_cost(None)
    assert usage.cost_usd == 0.5


def test_reserve_waits_for_room_held_in_flight_then_gets_it(tmp_path: Path) -> None:
    """A request that does not fit only because others are in flight waits for them."""
    from vfops.budget import RegistryLedger
    from vfops.costs import BudgetExhausted
    from vfops.registry import ThreadService

    engine = get_engine(f"sqlite:///{tmp_path / 'registry.db'}")

    async def main() -> tuple[list[float], bool]:
        with session_scope(engine) as session:
            set_cost_caps(session, {"s": 1.0})
        ledger = RegistryLedger(ThreadService(engine), ["s"], None)
        first = await ledger.reserve(0.7)
        waiting = asyncio.ensure_future(ledger.reserve(0.5))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # 0.7 in flight: no room yet
        await ledger.settle(first, 0.4)  # spent 0.4: 0.5 fits now
        second = await asyncio.wait_for(waiting, 5)
        await ledger.settle(second, 0.5)
        try:  # 0.9 spent: 0.2 can never fit
            await ledger.reserve(0.2)
        except BudgetExhausted:
            return [0.4, 0.5], True
        return [], False

    spent, refused = asyncio.run(main())
    assert refused
    with session_scope(engine) as session:
        budget = get_cost_budget(session, "s")
    assert budget is not None and budget.spent_usd == pytest.approx(sum(spent))


# --- sweeps sharing a cap ----------------------------------------------------------------

_SWEEP_WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from vfops.sweeps import SamplingConfig, SweepSpec, run_cell_async, validate_sweep

    endpoints, out, name, cap = sys.argv[1], Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    spec = SweepSpec(
        environments=["arithmetic"], endpoints=["priced"], endpoints_file=endpoints,
        sampling=[SamplingConfig(name=f"{name}-{t}", args={"temperature": t, "max_tokens": 32})
                  for t in (0.0, 0.3, 0.6)],
        num_examples=200, rollouts_per_example=2, max_concurrent=16,
        tags=[f"sweep:{name}"], max_cost=cap, cost_scope="team",
    )

    async def main():
        cells = validate_sweep(spec)
        results = await asyncio.gather(*(run_cell_async(c, output_root=out) for c in cells))
        print(json.dumps([[r.status, r.cost_usd] for r in results]))

    asyncio.run(main())
    """
)


def test_two_sweeps_in_two_processes_share_one_cap(db_url: str, tmp_path: Path) -> None:
    """The bar: two sweeps started together, each in its own process (as on two workers),
    naming one cost scope: together they spend at most the cap plus the reservations in
    flight, and their cells stop budget_exhausted instead of failing."""
    cap = 0.02  # 12 cells x 400 rollouts cost about 0.45: the cap stops them early
    with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=20)) as stub:
        endpoints = endpoints_file(tmp_path, stub.base_url)
        env = {
            "PATH": "/usr/bin:/bin", "VFOPS_DATABASE_URL": db_url, "VFOPS_TRACKING": "0",
            "VFOPS_HOME": str(tmp_path / "home"),
        }  # fmt: skip
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _SWEEP_WORKER,
                    str(endpoints),
                    str(tmp_path / name),
                    name,
                    str(cap),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for name in ("a", "b")
        ]
        outputs = [w.communicate(timeout=280) for w in workers]
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-3000:]
    cells = [cell for out, _ in outputs for cell in json.loads(out.strip().splitlines()[-1])]
    assert len(cells) == 6
    assert {status for status, _ in cells} == {"budget_exhausted"}
    with session_scope(get_engine(db_url)) as session:
        team = get_cost_budget(session, "sweep:team")
    assert team is not None and team.cap_usd == pytest.approx(cap)
    # each request reserves at most this; at most 6 cells x 16 rollouts are in flight
    one_reservation = Pricing(2.0, 8.0).worst_case(200, 32)
    assert team.spent_usd <= cap + one_reservation
    assert team.spent_usd > cap * 0.5  # both sweeps spent, neither stopped at once
    assert team.reserved_usd == pytest.approx(0.0, abs=1e-12)
    recorded = sum(cost or 0.0 for _, cost in cells)
    assert recorded <= team.spent_usd + 1e-12


def test_sweep_and_nightly_specs_take_a_cap_and_name_its_scope(tmp_path: Path) -> None:
    from vfops._config import ConfigError
    from vfops.nightly import NightlyConfig
    from vfops.sweeps import SweepSpec, load_sweep

    base = {"environments": ["arithmetic"], "endpoints": ["priced"]}
    uncapped = SweepSpec(**base)
    assert uncapped.cost_caps() == {}
    own = SweepSpec(**base, max_cost=2.5)
    ((scope, cap),) = own.cost_caps().items()
    assert cap == 2.5 and scope.startswith("sweep:")
    assert SweepSpec(**base, max_cost=9.0).cost_caps().keys() == {scope}  # a rerun: same cap
    shared = SweepSpec(**base, max_cost=2.5, cost_scope="team")
    assert shared.cost_caps() == {"sweep:team": 2.5}
    night = NightlyConfig(**base, max_cost=1.0, date="2026-11-30").sweep()
    assert night.cost_caps() == {"sweep:nightly:2026-11-30": 1.0}
    assert NightlyConfig(**base, date="2026-11-30").sweep().cost_caps() == {}
    bad = tmp_path / "sweep.toml"
    bad.write_text('environments = ["arithmetic"]\nendpoints = ["priced"]\nmax_cost = -1\n')
    with pytest.raises(ConfigError, match="max_cost"):
        load_sweep(bad)
