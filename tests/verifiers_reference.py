"""Reference scores: run an environment with ``verifiers``' own evaluation, in-process.

``verifiers_rewards(env_id, base_url, ...)`` loads the environment with
``vf.load_environment(env_id, **env_args)`` and runs ``Environment.evaluate``
(verifiers 0.3.1, classic API) against an OpenAI-compatible endpoint, e.g. vfops'
stub server. It returns ``example_id -> [reward of each rollout]``: what vfops'
verifiers adapter must reproduce. ``verifiers_metrics`` gives the per-function
metrics the same way; ``verifiers_outputs`` the raw ``RolloutOutput`` dicts.

0.3.1's ``evaluate`` takes a ``vf.Client`` (here ``vf.OpenAIChatCompletionsClient``
around an ``openai.AsyncOpenAI``) or a ``vf.ClientConfig``; a bare ``AsyncOpenAI``
is rejected ("Unsupported client type"). A ClientConfig reads its key from an
environment variable (``PRIME_API_KEY`` and ``~/.prime/config.json`` by default),
so the wrapped client is the simpler choice for a local endpoint.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import verifiers as vf
from openai import AsyncOpenAI

Output = dict[str, Any]
"""A ``vf.RolloutOutput``: a dict with ``example_id``, ``reward``, ``metrics``,
``prompt``, ``completion``, ``answer``, ``info``, ``error``, ``stop_condition``,
``is_completed``, ``is_truncated``, ``timing``, ``token_usage``, ``tool_defs``, and
each metric again as a top-level key."""


def _ignore(*_: object) -> None:
    return None


def verifiers_outputs(
    env_id: str,
    base_url: str,
    *,
    num_examples: int,
    rollouts_per_example: int,
    env_args: dict[str, Any] | None = None,
    sampling_args: dict[str, Any] | None = None,
    model: str = "stub-model",
    max_concurrent: int = -1,
    state_columns: list[str] | None = None,
) -> list[Output]:
    """The ``RolloutOutput`` of every rollout, sorted by ``example_id``."""
    env = vf.load_environment(env_id, **(env_args or {}))

    async def run() -> vf.GenerateOutputs:
        client = vf.OpenAIChatCompletionsClient(
            AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        )
        try:
            return await env.evaluate(
                client=client,
                model=model,
                sampling_args=sampling_args,
                num_examples=num_examples,
                rollouts_per_example=rollouts_per_example,
                max_concurrent=max_concurrent,
                state_columns=state_columns,
                on_start=_ignore,  # the defaults draw a tqdm progress bar
                on_progress=_ignore,
                on_log=_ignore,
            )
        finally:
            await client.close()

    results = asyncio.run(run())
    return [dict(output) for output in results["outputs"]]


def rewards_by_example(outputs: Sequence[Output]) -> dict[int, list[float]]:
    rewards: dict[int, list[float]] = defaultdict(list)
    for output in outputs:
        rewards[int(output["example_id"])].append(float(output["reward"]))
    return dict(rewards)


def metrics_by_example(outputs: Sequence[Output]) -> dict[int, list[dict[str, float]]]:
    metrics: dict[int, list[dict[str, float]]] = defaultdict(list)
    for output in outputs:
        values = output.get("metrics") or {}
        metrics[int(output["example_id"])].append({k: float(v) for k, v in values.items()})
    return dict(metrics)


def verifiers_rewards(
    env_id: str,
    base_url: str,
    *,
    num_examples: int,
    rollouts_per_example: int,
    env_args: dict[str, Any] | None = None,
    sampling_args: dict[str, Any] | None = None,
) -> dict[int, list[float]]:
    """``example_id -> [reward of each rollout]`` from verifiers' own ``evaluate``."""
    return rewards_by_example(
        verifiers_outputs(
            env_id,
            base_url,
            num_examples=num_examples,
            rollouts_per_example=rollouts_per_example,
            env_args=env_args,
            sampling_args=sampling_args,
        )
    )


def verifiers_metrics(
    env_id: str,
    base_url: str,
    *,
    num_examples: int,
    rollouts_per_example: int,
    env_args: dict[str, Any] | None = None,
    sampling_args: dict[str, Any] | None = None,
) -> dict[int, list[dict[str, float]]]:
    """``example_id -> [{reward function or metric name: value} of each rollout]``."""
    return metrics_by_example(
        verifiers_outputs(
            env_id,
            base_url,
            num_examples=num_examples,
            rollouts_per_example=rollouts_per_example,
            env_args=env_args,
            sampling_args=sampling_args,
        )
    )
