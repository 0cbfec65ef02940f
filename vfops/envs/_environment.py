"""The Environment base: a dataset, a rollout procedure and a rubric.

Subclasses implement :meth:`Environment.rollout`. Everything else (dataset
formatting, group generation and scoring, turning states into rollout records)
is shared, so eval and training consume environments identically.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from vfops._errors import InvalidArgumentError, VfopsError
from vfops._rollout import RolloutError, RolloutRecord, Timing, TokenUsage
from vfops._rollout_scope import rollout_scope
from vfops._tool_counts import FIRST_TOOL_ERROR, first_tool_error, tool_count_metrics
from vfops._types import Info, Messages, SamplingArgs, State
from vfops.clients import ModelClient
from vfops.envs._dataset import (
    DatasetSource,
    Example,
    FormattedSplit,
    Rows,
    format_dataset,
    is_dataset,
    iter_examples,
    resolve_source,
    rows_to_dataset,
)
from vfops.envs._load_errors import load_failure
from vfops.parsers import Parser
from vfops.rubrics import RolloutScore, Rubric

if TYPE_CHECKING:
    from datasets import Dataset


class Scorer(Protocol):
    """What scores a group of rollouts: a Rubric, a RubricGroup or a router of them."""

    async def score_group(self, states: list[State]) -> list[RolloutScore]: ...


class Environment(ABC):
    """Base class of every environment.

    ``dataset`` and ``eval_dataset`` are a ``datasets.Dataset``, plain rows (a list
    of dicts), or a zero-argument callable building either (built lazily, on first
    use). Plain rows keep ``vfops eval`` from importing ``datasets``
    (:meth:`eval_size`, :meth:`iter_eval_examples`); the ``dataset`` and
    ``eval_dataset`` properties still return Datasets, converted on first access.
    Rows carry ``prompt`` (chat messages) or ``question`` (a string turned into
    messages with ``system_prompt`` and ``few_shot``), and optionally ``answer``,
    ``info``, ``task`` and ``example_id`` (added when absent). ``sampling_args``
    are this environment's defaults; arguments given at eval time override them.
    """

    def __init__(
        self,
        *,
        dataset: DatasetSource | None = None,
        eval_dataset: DatasetSource | None = None,
        system_prompt: str | None = None,
        few_shot: Messages | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        sampling_args: SamplingArgs | None = None,
        name: str | None = None,
        task: str = "default",
    ) -> None:
        if dataset is None and eval_dataset is None:
            raise InvalidArgumentError("an environment needs a dataset or an eval_dataset")
        self.name = name or type(self).__name__
        self.system_prompt = system_prompt
        self.few_shot = few_shot
        self.parser = parser or Parser()
        self.rubric = rubric or Rubric(parser=self.parser)
        self.sampling_args: SamplingArgs = dict(sampling_args or {})
        self.task = task
        self._dataset_source = dataset
        self._eval_dataset_source = eval_dataset
        self._formatted: dict[str, FormattedSplit | None] = {}
        self._converted: dict[str, Dataset] = {}

    # --- datasets -------------------------------------------------------------
    def _formatted_split(self, split: str) -> FormattedSplit | None:
        """The formatted ``train`` or ``eval`` split, as built: rows or a Dataset."""
        if split not in self._formatted:
            source = self._dataset_source if split == "train" else self._eval_dataset_source
            try:
                # rows a builder returned are held by the split alone: kept packed
                self._formatted[split] = self._format(
                    resolve_source(source), owned=callable(source)
                )
            except VfopsError:
                raise
            except Exception as exc:
                # A split built lazily (a callable) fails here, after load_environment
                # returned: the same one line with the fix for its kind, not a traceback.
                label = "training" if split == "train" else "eval"
                raise load_failure(
                    f"the {label} dataset of environment '{self.name}' could not be built:", exc
                ) from exc
        return self._formatted[split]

    def _format(self, raw: Dataset | Rows | None, *, owned: bool) -> FormattedSplit | None:
        if raw is None:
            return None
        return format_dataset(
            raw,
            env_name=self.name,
            system_prompt=self.system_prompt,
            few_shot=self.few_shot,
            default_task=self.task,
            owned=owned,
        )

    def _eval_split(self) -> FormattedSplit | None:
        """The formatted eval split as built, falling back to the training split."""
        found = self._formatted_split("eval")
        return found if found is not None else self._formatted_split("train")

    def _dataset_split(self, split: str) -> Dataset | None:
        """The formatted split as a Dataset: plain rows are converted once, then cached."""
        data = self._formatted_split(split)
        if data is None or is_dataset(data):
            return data
        if split not in self._converted:
            self._converted[split] = rows_to_dataset(data)
        return self._converted[split]

    @property
    def dataset(self) -> Dataset | None:
        """The formatted training dataset (None when the environment has only eval data)."""
        return self._dataset_split("train")

    @property
    def eval_dataset(self) -> Dataset | None:
        """The formatted eval dataset, falling back to the training dataset."""
        found = self._dataset_split("eval")
        return found if found is not None else self._dataset_split("train")

    def splits(self) -> dict[str, Dataset]:
        """The formatted splits the environment defines (``train`` and/or ``eval``)."""
        found = {split: self._dataset_split(split) for split in ("train", "eval")}
        return {split: data for split, data in found.items() if data is not None}

    def eval_size(self, wanted: int = -1) -> int | None:
        """Rows of the eval split (falling back to train, as ``eval_dataset`` does);
        None when there is neither. Never converts plain rows to a Dataset. ``wanted``:
        how many the caller will read (-1: all); an endless source builds only those."""
        found = self._eval_split()
        return None if found is None else len(found)

    def drop_built_rows(self) -> None:
        """Forget the splits built so far; they are built again from their sources on
        next use. A scoring worker's zygote calls it: scoring needs the rubric, not a
        copy of the rows."""
        self._formatted.clear()
        self._converted.clear()

    def get_dataset(self, n: int = -1, seed: int | None = None) -> Dataset:
        return _take(self.dataset, n, seed, self.name, "dataset")

    def get_eval_dataset(self, n: int = -1, seed: int | None = None) -> Dataset:
        return _take(self.eval_dataset, n, seed, self.name, "eval_dataset")

    def iter_eval_examples(self, n: int = -1) -> Iterator[Example]:
        """The first ``n`` eval examples (all when negative), read from the split as
        built: plain rows never go through ``datasets``."""
        found = self._eval_split()
        assert found is not None  # the constructor requires one of the two splits
        return iter_examples(found, n)

    async def aclose(self) -> None:
        """Release what the environment holds (a judge client, a sandbox...)."""
        await self.rubric.aclose()

    # --- rollouts ---------------------------------------------------------------
    @abstractmethod
    async def rollout(
        self,
        client: ModelClient,
        model: str,
        example: Example,
        *,
        rollout_index: int = 0,
        sampling_args: SamplingArgs | None = None,
    ) -> State:
        """Run one rollout; return its final state (never raise for model errors)."""

    def notices(self) -> list[str]:
        """What a user should know about how this environment runs under vfops (e.g. an
        adapted library's run that differs from that library's own eval), one line each:
        kept in the run's metadata and printed with its summary."""
        return []

    def episode_of(self, rollout_index: int) -> int:
        """The planned episode a stored rollout index belongs to: itself, unless the
        environment's episodes produce several traces (see ``RolloutRecord.episode``)."""
        return rollout_index

    def merged_sampling_args(self, overrides: SamplingArgs | None) -> SamplingArgs:
        return {**self.sampling_args, **(overrides or {})}

    def rubric_for(self, task: str) -> Scorer:
        """The rubric that scores rollouts of ``task`` (EnvGroup routes per task)."""
        return self.rubric

    async def run_group(
        self,
        client: ModelClient,
        model: str,
        example: Example,
        rollout_indices: Sequence[int],
        *,
        sampling_args: SamplingArgs | None = None,
        limiter: asyncio.Semaphore | None = None,
    ) -> list[RolloutRecord]:
        """Generate the rollouts of one example concurrently, then score them as a group."""
        sampling = self.merged_sampling_args(sampling_args)
        states, scores = await self.run_group_states(
            client, model, example, rollout_indices, sampling_args=sampling_args, limiter=limiter
        )
        return [
            state_to_record(state, score, model=model, sampling_args=sampling)
            for state, score in zip(states, scores, strict=True)
        ]

    async def run_group_states(
        self,
        client: ModelClient,
        model: str,
        example: Example,
        rollout_indices: Sequence[int],
        *,
        sampling_args: SamplingArgs | None = None,
        limiter: asyncio.Semaphore | None = None,
    ) -> tuple[list[State], list[RolloutScore]]:
        """Like :meth:`run_group`, but the final states (with ``state["responses"]``,
        the raw model responses training needs) and their scores.

        Each rollout runs in its own asyncio task, so context variables a client sets
        during a rollout are private to that rollout.
        """
        sampling = self.merged_sampling_args(sampling_args)

        async def one(index: int) -> State:
            # what the rollout starts (a sandbox) is labelled with it: its own task's
            # context, so the label is this rollout's alone
            with rollout_scope(example.example_id, index):
                if limiter is None:
                    return await self.rollout(
                        client, model, example, rollout_index=index, sampling_args=sampling
                    )
                async with limiter:
                    return await self.rollout(
                        client, model, example, rollout_index=index, sampling_args=sampling
                    )

        states = list(await asyncio.gather(*(one(i) for i in rollout_indices)))
        scores = await self.rubric_for(example.task).score_group(states)
        return states, scores


def _take(dataset: Dataset | None, n: int, seed: int | None, env: str, split: str) -> Dataset:
    if dataset is None:
        raise InvalidArgumentError(f"environment '{env}' has no {split}")
    if seed is not None:
        dataset = dataset.shuffle(seed=seed)
    if 0 <= n < len(dataset):
        dataset = dataset.select(range(n))
    return dataset


def new_state(example: Example, rollout_index: int) -> State:
    """The initial state every rollout starts from (reward functions may read any key)."""
    return {
        "example_id": example.example_id,
        "rollout_index": rollout_index,
        "prompt": example.prompt,
        "completion": [],
        "answer": example.answer,
        "info": example.info,
        "task": example.task,
        "turn": 0,
        "responses": [],
        "usage": TokenUsage(),
        "stop_reason": "completed",
        "error": None,
        "generation_ms": 0.0,
        "started_at": time.perf_counter(),
    }


def state_to_record(
    state: State, score: RolloutScore, *, model: str, sampling_args: SamplingArgs
) -> RolloutRecord:
    """Combine a finished state and its score into the rollout record.

    A state that counted its tool calls (``tool_calls``, ``tool_errors``,
    ``first_tool_error``: :mod:`vfops._tool_counts`) gives the metrics of those names
    (they replace a rubric's of the same name: the state's are the counts) and the
    first error's message in ``info``."""
    generation_error: RolloutError | None = state.get("error")
    # A rollout whose generation failed is not scored: 0.0 would bias the mean. Unless
    # the state says the error is the model's own answer (``error_scored``: an empty or
    # invalid reply, which an adapted library scores), whose score is kept beside it.
    unscored = generation_error is not None and not state.get("error_scored", False)
    reward = None if unscored else score.reward
    return RolloutRecord(
        example_id=state["example_id"],
        rollout_index=state["rollout_index"],
        prompt=state["prompt"],
        completion=state["completion"],
        answer=state["answer"],
        info=_info(state),
        task=state["task"],
        reward=reward,
        metrics=_metrics(state, score),
        stop_reason=state["stop_reason"],
        error=generation_error or score.error,
        timing=Timing(generation_ms=state["generation_ms"], scoring_ms=score.scoring_ms),
        usage=state["usage"],
        turns=state["turn"],
        episode=state.get("episode"),
        agent=state.get("agent", ""),
        model=model,
        sampling_args=sampling_args,
    )


def _metrics(state: State, score: RolloutScore) -> dict[str, float]:
    counts = tool_count_metrics(state)
    return {**score.metrics, **counts} if counts else score.metrics


def _info(state: State) -> Info:
    message = first_tool_error(state)
    if message is None:
        info: Info = state["info"]
        return info
    # a copy: the rollouts of one example share its info
    return {**state["info"], FIRST_TOOL_ERROR: message}
