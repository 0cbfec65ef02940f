"""LLM-as-judge rubric: a judge model grades the response against the answer."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypedDict, Unpack, runtime_checkable

from vfops._errors import VfopsError
from vfops._types import Messages, SamplingArgs, State
from vfops.costs import charge_rollout
from vfops.parsers import Parser, last_user_text, message_text
from vfops.rubrics._limits import not_counted
from vfops.rubrics._rubric import RewardFunc, Rubric

if TYPE_CHECKING:  # importing vfops.clients at runtime would pull in aiohttp for nothing
    from vfops.clients import ModelClient

DEFAULT_JUDGE_PROMPT = """Given a ground truth answer and a response, \
determine if the response is correct.

Question:
```
{question}
```

Ground truth answer:
```
{answer}
```

Response:
```
{response}
```

Respond either "yes" or "no" only."""

_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_RETRY_STATUS = frozenset({408, 409, 425, 429})


@runtime_checkable
class JudgeCache(Protocol):
    """Storage for judge replies, keyed by :func:`judge_cache_key`."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, text: str) -> None: ...


class InMemoryJudgeCache:
    """A process-local :class:`JudgeCache`; the oldest entries go past ``max_entries``."""

    def __init__(self, max_entries: int | None = 100_000) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[str, str] = OrderedDict()
        self.hits = 0
        self.misses = 0

    async def get(self, key: str) -> str | None:
        text = self._data.get(key)
        if text is None:
            self.misses += 1
        else:
            self.hits += 1
            self._data.move_to_end(key)
        return text

    async def set(self, key: str, text: str) -> None:
        self._data[key] = text
        self._data.move_to_end(key)
        if self.max_entries is not None:
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


def judge_cache_key(
    *,
    judge_model: str,
    sampling_args: SamplingArgs | None,
    template: str,
    prompt: str,
    response: str,
    answer: str,
) -> str:
    """sha256 over everything that determines the judge's reply."""
    args = json.dumps(sampling_args or {}, sort_keys=True, default=str)
    # A JSON list keeps field boundaries unambiguous ("ab"+"c" != "a"+"bc").
    payload = json.dumps([judge_model, args, template, prompt, response, answer])
    return hashlib.sha256(payload.encode()).hexdigest()


def is_transient_error(exc: BaseException) -> bool:
    """Whether retrying the judge call may succeed (network, timeout, 429, 5xx)."""
    # vfops.clients' APITimeoutError / APIConnectionError subclass these two.
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status in _RETRY_STATUS or status >= 500
    # Only look at a library already imported: its exceptions cannot occur otherwise.
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def judge_says_yes(text: str) -> bool:
    """True when the first "yes"/"no" word of the judge's reply is "yes"."""
    match = _YES_NO.search(text)
    return match is not None and match.group(1).lower() == "yes"


class JudgeOptionKeywords(TypedDict, total=False):
    """The keywords of :class:`JudgeOptions`, for ``JudgeRubric(..., max_retries=5)``."""

    max_concurrent: int
    max_retries: int
    cache: JudgeCache | None
    retry_base_delay: float
    retry_max_delay: float
    scoring_timeout_s: float | None


@dataclass(frozen=True)
class JudgeOptions:
    """How a :class:`JudgeRubric` calls its judge: concurrency, retries, cache, limit.

    Judge calls share one semaphore of ``max_concurrent`` slots, retry transient
    errors ``max_retries`` times (exponential backoff with jitter from
    ``retry_base_delay`` up to ``retry_max_delay`` seconds), and go through ``cache``
    when given. ``scoring_timeout_s`` bounds the rubric's other reward functions.
    """

    max_concurrent: int = 8
    max_retries: int = 3
    cache: JudgeCache | None = None
    retry_base_delay: float = 0.5
    retry_max_delay: float = 30.0
    scoring_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise VfopsError(f"max_concurrent must be at least 1, got {self.max_concurrent}")
        if self.max_retries < 0:
            raise VfopsError(f"max_retries must be 0 or more, got {self.max_retries}")


class JudgeRubric(Rubric):
    """Scores with a judge model: ``judge_reward`` is 1.0 when the judge says yes.

    Reward functions of this rubric may also name ``judge`` to receive the async
    :meth:`judge` method, e.g. ``async def f(judge, prompt, completion, answer,
    state)``. The keywords mirror verifiers' ``JudgeRubric``: the judge (client,
    model, prompt, sampling arguments), the parser and reward functions here, and
    how the judge is called (``max_concurrent``, ``max_retries``, ``cache``, the
    retry delays, ``scoring_timeout_s``) as the fields of :class:`JudgeOptions`.
    Time spent in :meth:`judge` does not count against ``scoring_timeout_s``: the
    judge client's own timeout and the retries bound it.
    """

    _extra_arg_names: ClassVar[tuple[str, ...]] = ("judge",)

    def __init__(
        self,
        judge_client: ModelClient | None = None,
        judge_model: str = "gpt-4.1-mini",
        judge_prompt: str = DEFAULT_JUDGE_PROMPT,
        judge_sampling_args: SamplingArgs | None = None,
        parser: Parser | None = None,
        *,
        funcs: Sequence[RewardFunc] | None = None,
        weights: Sequence[float] | None = None,
        **options: Unpack[JudgeOptionKeywords],
    ) -> None:
        try:
            judge_prompt.format(question="", answer="", response="")
        except (KeyError, IndexError, ValueError) as exc:
            raise VfopsError(
                f"judge_prompt is not a valid template ({type(exc).__name__}: {exc}); it may "
                "use {question}, {answer} and {response}, and must write other braces as {{ }}"
            ) from exc
        self.options = settings = JudgeOptions(**options)
        self.judge_client = judge_client
        self.judge_model = judge_model
        self.judge_prompt = judge_prompt
        self.judge_sampling_args: SamplingArgs = dict(judge_sampling_args or {})
        self.max_concurrent = settings.max_concurrent
        self.max_retries = settings.max_retries
        self.retry_base_delay = settings.retry_base_delay
        self.retry_max_delay = settings.retry_max_delay
        self.cache = settings.cache
        # asyncio primitives belong to one event loop; keep one semaphore per loop.
        self._semaphore_loop: asyncio.AbstractEventLoop | None = None
        self._semaphore_obj: asyncio.Semaphore | None = None
        # Identical judge requests in flight at once share one call.
        self._inflight: dict[str, asyncio.Future[str]] = {}
        if funcs is None:
            funcs, weights = [self.judge_reward], None
        super().__init__(
            funcs=funcs,
            weights=weights,
            parser=parser,
            scoring_timeout_s=settings.scoring_timeout_s,
        )

    def _extra_args(self) -> dict[str, Any]:
        return {"judge": self.judge}

    async def aclose(self) -> None:
        """Close the judge client (the rubric owns the client it was given)."""
        if self.judge_client is not None:
            await self.judge_client.aclose()

    def cache_key(self, question: str, response: str, answer: str) -> str:
        """This rubric's :func:`judge_cache_key` for one request."""
        return judge_cache_key(
            judge_model=self.judge_model,
            sampling_args=self.judge_sampling_args,
            template=self.judge_prompt,
            prompt=question,
            response=response,
            answer=answer,
        )

    async def judge_reward(
        self, prompt: Messages | str, completion: Messages | str, answer: str, state: State
    ) -> float:
        """1.0 when the judge's reply says yes, else 0.0."""
        return 1.0 if judge_says_yes(await self.judge(prompt, completion, answer, state)) else 0.0

    async def judge(
        self,
        prompt: Messages | str,
        completion: Messages | str,
        answer: str,
        state: State | None = None,
    ) -> str:
        """The judge's raw reply for this response; also kept in ``state["judge_response"]``."""
        if self.judge_client is None:
            raise VfopsError(
                "JudgeRubric has no judge_client; pass judge_client=... (e.g. an OpenAIClient)"
            )
        question = last_user_text(prompt)
        response = self.parser.parse_answer(completion) or ""
        key = self.cache_key(question, response, answer)
        if state is not None and state.get("judge_cache_key") == key:
            cached = state.get("judge_response")
            if isinstance(cached, str):
                return cached
        with not_counted():
            text = await self._judge_once(key, question, response, answer)
        if state is not None:
            state["judge_response"] = text
            state["judge_cache_key"] = key
        return text

    async def _judge_once(self, key: str, question: str, response: str, answer: str) -> str:
        inflight = self._inflight.get(key)
        if inflight is not None:
            return await asyncio.shield(inflight)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            text = await self._lookup_or_call(key, question, response, answer)
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: nobody else may be waiting
            raise
        except BaseException:
            future.cancel()
            raise
        else:
            future.set_result(text)
            return text
        finally:
            del self._inflight[key]

    async def _lookup_or_call(self, key: str, question: str, response: str, answer: str) -> str:
        if self.cache is not None:
            cached = await self.cache.get(key)
            if cached is not None:
                return cached
        content = self.judge_prompt.format(question=question, answer=answer, response=response)
        text = await self._call(content)
        if self.cache is not None:
            await self.cache.set(key, text)
        return text

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore_obj is None or self._semaphore_loop is not loop:
            self._semaphore_obj = asyncio.Semaphore(self.max_concurrent)
            self._semaphore_loop = loop
        return self._semaphore_obj

    async def _call(self, content: str) -> str:
        assert self.judge_client is not None
        semaphore = self._semaphore()
        messages: Messages = [{"role": "user", "content": content}]
        attempt = 0
        while True:
            try:
                async with semaphore:
                    reply = await self.judge_client.chat(
                        model=self.judge_model,
                        messages=messages,
                        sampling_args=dict(self.judge_sampling_args) or None,
                    )
                charge_rollout(reply.cost_usd)  # to the rollout being scored
                return message_text(reply.message)
            except Exception as exc:
                if attempt >= self.max_retries or not is_transient_error(exc):
                    raise
            # Back off outside the semaphore so waiting retries do not hold a slot.
            delay = min(self.retry_max_delay, self.retry_base_delay * 2**attempt)
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            attempt += 1
