"""Training on an environment written for ``verifiers``: exact tokens for every turn.

``vf_guess`` (tests/verifiers_envs) is a ``verifiers`` MultiTurnEnv. Its rollouts run
through the trainer's ``hf`` backend exactly as a vfops environment's do: every turn's
response carries the prompt ids, the sampled ids and their behaviour log-probs, each
turn continues the previous one's exact tokens, and ``vfops.training.train`` (what
``vfops train`` and the ``train-grpo`` flow call) runs GRPO steps on it.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from vfops.envs import load_environment
from vfops.training import (
    TOKENS_KEY,
    GRPOConfig,
    HFBackend,
    load_config,
    rollout_sequences,
    train,
)

pytestmark = pytest.mark.train

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "train" / "cpu_lucky_digit.toml"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vfops.local import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_every_turn_of_a_verifiers_rollout_is_token_in_token_out(tiny_dir: Path) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    env = load_environment("vf_guess", num_examples=2, num_train_examples=4, max_turns=3)
    backend = HFBackend(model, tokenizer)
    example = next(iter(env.iter_eval_examples(1)))

    async def run() -> Any:
        return await env.run_group_states(
            backend.client, "m", example, range(4), sampling_args={"max_tokens": 6, "seed": 3}
        )

    states, scores = asyncio.run(run())
    assert all(score.reward is not None for score in scores)
    for state in states:
        assert state["error"] is None
        turns = [response.raw[TOKENS_KEY] for response in state["responses"]]
        # one token record per model turn of verifiers' own trajectory
        assistant = [m for m in state["completion"] if m["role"] == "assistant"]
        assert len(turns) == state["turn"] == len(assistant) == 3  # the tiny model never wins
        for before, after in itertools.pairwise(turns):
            assert after["prompt_ids"][: len(before["prompt_ids"])] == before["prompt_ids"]
            start = len(before["prompt_ids"])
            assert (
                after["prompt_ids"][start : start + len(before["completion_ids"])]
                == (before["completion_ids"])
            )
        for turn, message in zip(turns, assistant, strict=True):
            assert len(turn["completion_logprobs"]) == len(turn["completion_ids"]) > 0
            assert all(lp <= 0.0 for lp in turn["completion_logprobs"])
            text = tokenizer.decode(turn["completion_ids"], skip_special_tokens=True)
            assert text.strip() == str(message["content"]).strip()
        assert len(rollout_sequences(turns)) == 1  # env replies masked between the turns
    # (backend.prefix_breaks counts turns where rendering the text again would have given
    # other ids than the sampled ones, the random model's text re-tokenising otherwise:
    # the exact ids above are what the trainer gets)
    assert len({str(s["completion"][0]["content"]) for s in states}) > 1  # samples differ


def _config(tiny_dir: Path, out: Path) -> GRPOConfig:
    return load_config(CPU_CONFIG).with_overrides(
        {
            "model.path": str(tiny_dir),
            "environment.id": "vf_guess",
            "environment.args": {"num_examples": 4, "num_train_examples": 8, "max_turns": 3},
            "generation.prompts_per_step": 2,
            "generation.group_size": 4,
            "generation.max_tokens": 6,
            "run.steps": 2,
            "run.eval_examples": 4,
            "run.output_dir": str(out),
            "run.tracking": False,
        }
    )


def test_vfops_train_runs_grpo_steps_on_a_verifiers_environment(
    tiny_dir: Path, tmp_path: Path
) -> None:
    seen: list[tuple[str, int, dict[str, float]]] = []
    result = train(
        _config(tiny_dir, tmp_path / "run"),
        progress=lambda kind, step, metrics: seen.append((kind, step, dict(metrics))),
    )
    assert result.steps == 2
    steps = [metrics for kind, _, metrics in seen if kind == "step"]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["rollouts"] == 8  # 2 prompts x groups of 4, none dropped
        assert metrics["sequences"] == 8  # each 3-turn rollout is one continued sequence
        assert metrics["trained_tokens"] > 8 * 3  # every turn's sampled tokens
    assert Path(result.checkpoint or "").is_dir()
    assert any(kind == "eval" for kind, _, _ in seen)
