"""Re-score the rollouts of a registry run with a judge, through the registry's judge cache.

Every verdict goes into the ``judge_cache`` table (reply text and score, keyed by
:func:`vfops.rubrics.judge_cache_key` over judge model, sampling args, template,
question, response and answer), so scoring the same rollouts with the same judge
again makes no judge call at all, in any process.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord, TokenUsage
from vfops.costs import scoring_rollout
from vfops.parsers import last_user_text
from vfops.registry import (
    RegistryJudgeCache,
    add_rollout_cost,
    get_run,
    iter_rollouts,
    session_scope,
)
from vfops.rubrics import JudgeRubric, judge_says_yes

if TYPE_CHECKING:
    from sqlalchemy import Engine

MAX_ERRORS_KEPT = 20
_CHUNK = 256  # rollouts read per trip to the database thread


def yes_no_score(text: str) -> float:
    """1.0 when the judge's reply says yes, else 0.0 (JudgeRubric's judge_reward)."""
    return 1.0 if judge_says_yes(text) else 0.0


@dataclass(frozen=True, slots=True)
class RolloutJudgement:
    """The judge's verdict on one rollout (``score`` ``None``: skipped or failed)."""

    example_id: int
    rollout_index: int
    key: str | None
    score: float | None
    cached: bool
    error: str | None = None


@dataclass(slots=True)
class RescoreResult:
    """What :func:`rescore_run` did: counts, the mean score and (optionally) every verdict."""

    run_id: str
    judge_model: str
    n_rollouts: int = 0
    """Rollouts read from the run."""
    n_judged: int = 0
    """Scored by a new judge request (identical requests in flight at once share one)."""
    n_cached: int = 0
    """Scored from the registry's judge cache: no request."""
    n_skipped: int = 0
    """Without a response to judge (the rollout failed before scoring)."""
    n_errors: int = 0
    """The judge request failed (after retries); a rerun tries these again."""
    cost_usd: float | None = None
    """What the new judge requests cost (``None``: the judge is unpriced); each one's
    cost is added to the stored rollout it scored."""
    score_sum: float = 0.0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    """The first error messages (at most ``MAX_ERRORS_KEPT``)."""
    judgements: list[RolloutJudgement] | None = None
    """Every verdict in (example_id, rollout_index) order, when ``keep_judgements``."""

    @property
    def n_scored(self) -> int:
        return self.n_judged + self.n_cached

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.n_scored if self.n_scored else None

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary (no per-rollout data)."""
        return {
            "run_id": self.run_id,
            "judge_model": self.judge_model,
            "n_rollouts": self.n_rollouts,
            "n_scored": self.n_scored,
            "n_judged": self.n_judged,
            "n_cached": self.n_cached,
            "n_skipped": self.n_skipped,
            "n_errors": self.n_errors,
            "mean_score": self.mean_score,
            "cost_usd": self.cost_usd,
            "elapsed_s": round(self.elapsed_s, 3),
            "errors": list(self.errors),
        }


def resolve_run_id(engine: Engine, run_id: str) -> str:
    """The full id of run ``run_id`` (an id or a unique prefix); :class:`VfopsError` if none."""
    with session_scope(engine, write=False) as session:
        run = get_run(session, run_id.strip())
        if run is None:
            raise VfopsError(
                f"no eval run with id {run_id!r} in the registry; list runs with `vfops runs list`"
            )
        return run.id


def _judgeable(record: RolloutRecord) -> bool:
    # a rollout that failed while generating has no (complete) response to judge
    return record.error is None or record.error.stage == "scoring"


async def rescore_run(
    engine: Engine,
    run_id: str,
    rubric: JudgeRubric,
    *,
    max_concurrent: int = 8,
    score_fn: Callable[[str], float] = yes_no_score,
    keep_judgements: bool = True,
    on_judgement: Callable[[RolloutJudgement], None] | None = None,
    page_size: int = 1000,
) -> RescoreResult:
    """Judge every rollout of run ``run_id`` with ``rubric``'s judge.

    Rollouts stream from the registry (memory does not grow with the run, except
    ``judgements`` when ``keep_judgements``); up to ``max_concurrent`` are judged
    at once (the rubric's own ``max_concurrent`` and its client's limiter, if
    any, apply too). The rubric's cache is a :class:`RegistryJudgeCache` on
    ``engine`` for the duration: a verdict already stored under the same key is
    reused without a request, and each new one is stored with its
    ``score_fn(reply)`` score. A failed judge request is counted and reported,
    not raised (rerunning retries it); errors reading the run are raised.
    """
    if max_concurrent < 1:
        raise VfopsError(f"max_concurrent must be at least 1, got {max_concurrent}")
    full_id = resolve_run_id(engine, run_id)
    result = RescoreResult(
        run_id=full_id, judge_model=rubric.judge_model, judgements=[] if keep_judgements else None
    )
    rescorer = _Rescorer(engine, rubric, result, score_fn, on_judgement)
    started = time.perf_counter()
    previous_cache = rubric.cache
    rubric.cache = rescorer.cache
    try:
        await rescorer.run(max_concurrent, page_size)
    finally:
        rubric.cache = previous_cache
    result.elapsed_s = time.perf_counter() - started
    return result


def _stream(engine: Engine, run_id: str, page_size: int) -> Generator[RolloutRecord]:
    """The run's rollouts, read in one read transaction that this generator holds."""
    with session_scope(engine, write=False) as session:
        yield from iter_rollouts(session, run_id, batch_size=page_size)


class _Rescorer:
    """One :func:`rescore_run`: a producer streams the run's rollouts into a bounded
    queue, workers judge them, and verdicts are counted (and handed on in run order)."""

    def __init__(
        self,
        engine: Engine,
        rubric: JudgeRubric,
        result: RescoreResult,
        score_fn: Callable[[str], float],
        on_judgement: Callable[[RolloutJudgement], None] | None,
    ) -> None:
        self.engine = engine
        self.rubric = rubric
        self.result = result
        self.score_fn = score_fn
        self.on_judgement = on_judgement
        self.cache = RegistryJudgeCache(engine, judge_model=rubric.judge_model)
        self.done: dict[int, RolloutJudgement] = {}  # out-of-order verdicts awaiting their turn
        self.next_to_emit = 0

    async def run(self, max_concurrent: int, page_size: int) -> None:
        records: asyncio.Queue[tuple[int, RolloutRecord] | None] = asyncio.Queue(
            maxsize=2 * max_concurrent
        )
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.produce(records, max_concurrent, page_size))
                for _ in range(max_concurrent):
                    group.create_task(self.work(records))
        except ExceptionGroup as group_error:
            # one task failed (reading the run) and the rest were cancelled: raise it as is
            if len(group_error.exceptions) == 1:
                raise group_error.exceptions[0] from None
            raise

    async def produce(
        self,
        records: asyncio.Queue[tuple[int, RolloutRecord] | None],
        workers: int,
        page_size: int,
    ) -> None:
        rollouts = _stream(self.engine, self.result.run_id, page_size)
        position = 0
        try:
            while True:
                chunk = await asyncio.to_thread(lambda: list(itertools.islice(rollouts, _CHUNK)))
                if not chunk:
                    break
                for record in chunk:
                    await records.put((position, record))
                    position += 1
        finally:
            await asyncio.to_thread(rollouts.close)  # ends the read transaction
        for _ in range(workers):
            await records.put(None)

    async def work(self, records: asyncio.Queue[tuple[int, RolloutRecord] | None]) -> None:
        while (item := await records.get()) is not None:
            position, record = item
            self.result.n_rollouts += 1
            self.emit(position, await self.judge_one(record))

    def emit(self, position: int, judgement: RolloutJudgement) -> None:
        result = self.result
        if judgement.error is not None:
            result.n_errors += 1
            if len(result.errors) < MAX_ERRORS_KEPT:
                result.errors.append(
                    f"example {judgement.example_id} rollout {judgement.rollout_index}: "
                    f"{judgement.error}"
                )
        elif judgement.score is None:
            result.n_skipped += 1
        else:
            result.score_sum += judgement.score
            if judgement.cached:
                result.n_cached += 1
            else:
                result.n_judged += 1
        if self.on_judgement is None and result.judgements is None:
            return
        # hand verdicts on in run order, whatever order they finished in
        self.done[position] = judgement
        while self.next_to_emit in self.done:
            ready = self.done.pop(self.next_to_emit)
            self.next_to_emit += 1
            if result.judgements is not None:
                result.judgements.append(ready)
            if self.on_judgement is not None:
                self.on_judgement(ready)

    async def judge_one(self, record: RolloutRecord) -> RolloutJudgement:
        ids = record.example_id, record.rollout_index
        if not _judgeable(record):
            return RolloutJudgement(*ids, key=None, score=None, cached=False)
        rubric, cache = self.rubric, self.cache
        question = last_user_text(record.prompt)
        response = rubric.parser.parse_answer(record.completion) or ""
        answer = record.answer or ""
        key = rubric.cache_key(question, response, answer)
        try:
            entry = await cache.get_entry(key)
            if entry is not None:
                score = entry.score
                if score is None or not math.isfinite(score):
                    score = self.score_fn(entry.response)
                    await cache.set_score(key, score)
                return RolloutJudgement(*ids, key=key, score=score, cached=True)
            text = await self._judge_charged(record, answer)
            score = self.score_fn(text)
            await cache.set_score(key, score)
            return RolloutJudgement(*ids, key=key, score=score, cached=False)
        except Exception as exc:  # one failed verdict must not stop the others
            error = f"{type(exc).__name__}: {exc}"[:500]
            return RolloutJudgement(*ids, key=key, score=None, cached=False, error=error)

    async def _judge_charged(self, record: RolloutRecord, answer: str) -> str:
        """The judge's reply; what its calls cost is added to the rollout it scored."""
        charged = TokenUsage()
        scoring_rollout(charged)  # the judge's calls below are this rollout's
        try:
            text = await self.rubric.judge(record.prompt, record.completion, answer)
        finally:
            scoring_rollout(None)
        if charged.cost_usd is not None:
            ids = record.example_id, record.rollout_index
            run_id = self.result.run_id
            await asyncio.to_thread(_add_cost, self.engine, run_id, ids, charged.cost_usd)
            self.result.cost_usd = (self.result.cost_usd or 0.0) + charged.cost_usd
        return text


def _add_cost(engine: Engine, run_id: str, ids: tuple[int, int], usd: float) -> None:
    """One rollout's judge cost, in a transaction of its own (from a worker thread)."""
    with session_scope(engine) as session:
        add_rollout_cost(session, run_id, *ids, usd)
