"""Training on a verifiers v1 taskset: the trainer's ``hf`` backend serves each rollout's
model calls through vfops's client, so every turn carries the prompt ids, the sampled ids
and their log-probs, and ``vfops.training.train`` (what ``vfops train`` and the
``train-grpo`` flow call) runs GRPO steps on ``v1_lucky_digit`` (tests/verifiers_v1_envs).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.vllm_fixtures import FakeVLLM
from vfops.envs import load_environment
from vfops.training import TOKENS_KEY, HFBackend, load_config, rollout_sequences, train

pytestmark = pytest.mark.train

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "train" / "cpu_v1_lucky_digit.toml"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vfops.local import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_a_v1_rollout_is_token_in_token_out(tiny_dir: Path) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    env = load_environment("v1_lucky_digit", num_tasks=4)
    backend = HFBackend(model, tokenizer)
    example = next(iter(env.iter_eval_examples(1)))

    async def run() -> tuple[list[dict], list]:
        return await env.run_group_states(
            backend.client, "m", example, range(4), sampling_args={"max_tokens": 6, "seed": 3}
        )

    states, scores = asyncio.run(run())
    assert all(score.reward is not None and score.error is None for score in scores)
    for state, score in zip(states, scores, strict=True):
        (turn,) = [response.raw[TOKENS_KEY] for response in state["responses"]]
        (reply,) = [m for m in state["completion"] if m["role"] == "assistant"]
        assert len(turn["completion_logprobs"]) == len(turn["completion_ids"]) > 0
        assert all(lp <= 0.0 for lp in turn["completion_logprobs"])
        text = tokenizer.decode(turn["completion_ids"], skip_special_tokens=True)
        assert text.strip() == str(reply["content"]).strip()
        assert len(rollout_sequences([turn])) == 1
        # the taskset's weighted rewards, its per-function scores kept as metrics
        weights = {"answered": 0.5, "starts_with_the_digit": 0.3, "stopped": 0.2}
        assert set(score.metrics) == set(weights)
        total = sum(weights[name] * value for name, value in score.metrics.items())
        assert score.reward == pytest.approx(total)
    assert len({str(s["completion"][0]["content"]) for s in states}) > 1  # samples differ


def test_vfops_train_runs_grpo_steps_on_a_v1_taskset(tiny_dir: Path, tmp_path: Path) -> None:
    config = load_config(CONFIG).with_overrides(
        {
            "model.path": str(tiny_dir),
            "environment.args": {"num_tasks": 16},
            "generation.prompts_per_step": 2,
            "generation.group_size": 4,
            "run.steps": 2,
            "run.eval_examples": 4,
            "run.output_dir": str(tmp_path / "run"),
            "run.tracking": False,
        }
    )
    seen: list[tuple[str, int, dict[str, float]]] = []
    result = train(config, progress=lambda kind, step, m: seen.append((kind, step, dict(m))))
    assert result.steps == 2
    steps = [metrics for kind, _, metrics in seen if kind == "step"]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["rollouts"] == metrics["sequences"] == 8  # 2 prompts x groups of 4
        assert metrics["trained_tokens"] > 8
    assert Path(result.checkpoint or "").is_dir()
    assert [kind for kind, _, _ in seen].count("eval") == 2  # before the first step, after the last


# verifiers' MCP client (harnesses/utils/mcp.py) passes tenacity's deprecated `initial`
@pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")
async def test_a_v1_tool_rollout_through_the_vllm_backend_keeps_every_turns_tokens(
    fake: tuple[FakeVLLM, str], tiny_dir: Path, tmp_path: Path
) -> None:
    """``v1_lookup`` (an MCP toolset per rollout) through the vLLM backend: the model asks
    its MCP tool, verifiers' toolset answers, the model replies; each turn's tokens are the
    server's exactly, the second continuing the first (the tool result between them is
    masked: one sequence)."""
    from transformers import AutoTokenizer

    from vfops.training._vllm import VLLMBackend, VLLMGenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    server, url = fake
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    env = load_environment("v1_lookup")
    example = next(iter(env.iter_eval_examples(1)))
    term = str(example.prompt[-1]["content"]).split('"')[1]
    call = f'<tool_call>{{"name":"dictionary_define","arguments":{{"term":"{term}"}}}}</tool_call>'
    sent = [[*encode(tokenizer, call), eos], [*encode(tokenizer, "<answer>done</answer>"), eos]]
    server.script += [list(ids) for ids in sent]
    config = VLLMGenerationConfig(
        base_url=url + "/v1", sync_dir=str(tmp_path / "sync"), max_retries=0
    )
    backend = VLLMBackend.from_config(config, tokenizer)
    try:
        states, scores = await env.run_group_states(
            backend.client, "tiny", example, [0], sampling_args={"max_tokens": 40}
        )
    finally:
        await backend.aclose()
        await env.aclose()
    (state,) = states
    assert state["error"] is None and scores[0].reward == 0.0  # "done" is not the definition
    assert [m["role"] for m in state["completion"]] == ["assistant", "tool", "assistant"]
    assert state["completion"][1]["content"] == example.answer  # verifiers ran the tool
    t1, t2 = (r.raw[TOKENS_KEY] for r in state["responses"])
    assert [t1["completion_ids"], t2["completion_ids"]] == sent
    prefix = t1["prompt_ids"] + t1["completion_ids"]
    assert t2["prompt_ids"][: len(prefix)] == prefix  # continued, not re-rendered
    assert len(rollout_sequences([t1, t2])) == 1
    assert server.bodies("/v1/completions")[1]["prompt"] == t2["prompt_ids"]


def encode(tokenizer: object, text: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    return [int(i) for i in ids]
