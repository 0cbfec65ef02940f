"""The judge cache: a judge's verdict, keyed on everything that can change it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy import Engine, select, update

from vfops.registry._db import get_engine, transaction
from vfops.registry._models import Base, JudgeCacheRow, utcnow
from vfops.registry._sql import on_conflict_insert


@dataclass(frozen=True, slots=True)
class JudgeCacheEntry:
    """A stored judge verdict: the reply text and, when known, its score."""

    key: str
    response: str
    score: float | None
    judge_model: str


class RegistryJudgeCache:
    """A :class:`vfops.rubrics.JudgeCache` in the registry, shared by runs and processes.

    The database calls run in a worker thread so the event loop never blocks.
    ``set`` is insert-or-ignore: the first verdict for a key stays.
    """

    def __init__(self, engine: Engine | None = None, *, judge_model: str = "") -> None:
        self.engine = engine or get_engine()
        self.judge_model = judge_model
        self._table = Base.metadata.tables["judge_cache"]

    # synchronous forms, for callers outside an event loop
    def get_entry_sync(self, key: str) -> JudgeCacheEntry | None:
        query = select(
            JudgeCacheRow.response, JudgeCacheRow.score, JudgeCacheRow.judge_model
        ).where(JudgeCacheRow.key == key)
        with transaction(self.engine, write=False) as connection:
            row = connection.execute(query).one_or_none()
        if row is None:
            return None
        return JudgeCacheEntry(key=key, response=row[0], score=row[1], judge_model=row[2])

    def set_sync(
        self, key: str, text: str, *, score: float | None = None, judge_model: str | None = None
    ) -> None:
        statement = on_conflict_insert(self.engine.dialect.name, self._table).values(
            key=key,
            response=text,
            score=score,
            judge_model=self.judge_model if judge_model is None else judge_model,
            created_at=utcnow(),
        )
        with transaction(self.engine) as connection:
            connection.execute(statement.on_conflict_do_nothing(index_elements=["key"]))

    def set_score_sync(self, key: str, score: float | None) -> None:
        with transaction(self.engine) as connection:
            connection.execute(
                update(JudgeCacheRow).where(JudgeCacheRow.key == key).values(score=score)
            )

    # the JudgeCache protocol
    async def get(self, key: str) -> str | None:
        entry = await asyncio.to_thread(self.get_entry_sync, key)
        return None if entry is None else entry.response

    async def set(
        self, key: str, text: str, *, score: float | None = None, judge_model: str | None = None
    ) -> None:
        await asyncio.to_thread(self.set_sync, key, text, score=score, judge_model=judge_model)

    async def get_entry(self, key: str) -> JudgeCacheEntry | None:
        return await asyncio.to_thread(self.get_entry_sync, key)

    async def set_score(self, key: str, score: float | None) -> None:
        """Store the score derived from a cached reply (e.g. 1.0 for "yes")."""
        await asyncio.to_thread(self.set_score_sync, key, score)
