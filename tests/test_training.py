"""GRPO maths, loss masking and multi-turn token consistency (tiny local model, CPU)."""

from __future__ import annotations

import asyncio
import copy
import itertools
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from vfops.training import TOKENS_KEY, HFBackend, prefix_breaks, rollout_sequences
from vfops.training._batch import pad as _pad
from vfops.training._config import LossConfig
from vfops.training._continuation import Turn
from vfops.training._loss import (
    LossInputs,
    LossNorm,
    group_advantages,
    token_logprobs,
)
from vfops.training._losses import policy_loss
from vfops.training._tokens import Sequence, encode, prompt_ids, render

pytestmark = pytest.mark.train

# Qwen3-style: assistant turns before the last user message lose their <think> block.
THINK_STRIPPING_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}"
    "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set content = m.content -%}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    import transformers

    from vfops.local import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    return model, tokenizer


@pytest.fixture(scope="module")
def qwen_like(tiny: tuple[Any, Any]) -> Any:
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = THINK_STRIPPING_TEMPLATE
    return tokenizer


# --------------------------------------------------------------------------- advantages, loss


def test_group_advantages_mean_centred_with_optional_std_scaling() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0], scale=False) == [0.5, -0.5, -0.5, 0.5]
    scaled = group_advantages([1.0, 0.0, 0.0, 1.0], scale=True)
    assert scaled == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-3)
    assert group_advantages([0.3, 0.3], scale=True) == [0.0, 0.0]


def _loss(loss_type: str, logp: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> float:
    loss, _ = policy_loss(
        LossInputs(logp, logp.detach(), torch.tensor([1.0, 1.0]), mask),
        LossConfig(type=loss_type, clip_low=0.2, clip_high=0.2, importance_correction="none"),
        norm,
    )
    return float(loss)


def test_loss_variants_normalise_differently() -> None:
    # On-policy (ratio 1), advantage 1: per-token loss is -1 on trained tokens.
    logp = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    norm = LossNorm(sequences=2, all_sequences=2, tokens=5, max_tokens=8)
    assert _loss("grpo", logp, mask, norm) == pytest.approx(-1.0)  # mean of per-seq means
    assert _loss("dapo", logp, mask, norm) == pytest.approx(-1.0)  # 5 tokens / 5
    assert _loss("dr_grpo", logp, mask, norm) == pytest.approx(-5 / 16)  # sum / (2 * 8)


def test_clipping_stops_the_gradient_outside_the_trust_region() -> None:
    old = torch.zeros(1, 2)
    logp = torch.tensor([[0.5, 0.05]], requires_grad=True)  # ratios e^0.5 (clipped), e^0.05
    loss, sums = policy_loss(
        LossInputs(logp, old, torch.tensor([1.0]), torch.ones(1, 2)),
        LossConfig(type="dapo", clip_low=0.2, clip_high=0.2, importance_correction="none"),
        LossNorm(1, 1, 2, 2),
    )
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] != 0.0
    assert sums["clipped_tokens"] == 1.0


def test_kl_term_is_zero_at_the_reference_and_positive_away_from_it() -> None:
    logp = torch.tensor([[-1.0, -2.0]])
    args: tuple[LossConfig, LossNorm] = (
        LossConfig(
            type="dapo", clip_low=0.2, clip_high=0.2, beta=0.1, importance_correction="none"
        ),
        LossNorm(1, 1, 2, 2),
    )
    _, at_ref = policy_loss(
        LossInputs(logp, logp, torch.zeros(1), torch.ones(1, 2), ref_logprobs=logp), *args
    )
    _, away = policy_loss(
        LossInputs(logp, logp, torch.zeros(1), torch.ones(1, 2), ref_logprobs=logp - 1.0), *args
    )
    assert at_ref["kl_sum"] == 0.0 and away["kl_sum"] > 0.0


def _gradient(
    correction: str, ratios: list[float], advantages: list[float], cap: float = 2.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """d loss / d logp for tokens whose trainer/behaviour ratio is ``ratios`` (every row)."""
    rows = len(advantages)
    behaviour = torch.full((rows, len(ratios)), -1.0)
    logp = (behaviour + torch.log(torch.tensor(ratios))).requires_grad_()
    loss, sums = policy_loss(
        LossInputs(logp, behaviour, torch.tensor(advantages), torch.ones(rows, len(ratios))),
        LossConfig(
            type="dapo",
            clip_low=0.2,
            clip_high=0.2,
            importance_correction=correction,
            importance_cap=cap,
        ),
        LossNorm(rows, rows, rows * len(ratios), len(ratios)),
    )
    loss.backward()
    assert logp.grad is not None
    return logp.grad, sums


def test_truncated_importance_sampling_changes_the_gradient_exactly_as_its_formula_says() -> None:
    """TIS: per token ``d loss / d logp = -min(r, cap) * A / tokens`` (dapo), with ``r =
    exp(logp_trainer - logp_behaviour)``; uncorrected, the clip zeroes the tokens outside
    the trust region instead and weights the rest by ``r`` itself."""
    ratios, advantages, tokens = [0.5, 1.0, 1.5, 3.0], [1.0, -2.0], 8
    r = torch.tensor(ratios)
    for cap in (2.0, 1.0):
        grad, sums = _gradient("tis", ratios, advantages, cap)
        expected = torch.stack([-a * torch.clamp(r, max=cap) / tokens for a in advantages])
        torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-7)
        assert sums["is_capped_tokens"] == 2 * sum(x > cap for x in ratios)
        assert sums["is_weight_sum"] == pytest.approx(2 * float(torch.clamp(r, max=cap).sum()))
    assert sums["mismatch_ratio_max"] == pytest.approx(3.0)
    assert sums["mismatch_ratio_min"] == pytest.approx(0.5)
    k3 = r - torch.log(r) - 1.0  # E_behaviour[k3] = KL(behaviour || trainer)
    assert sums["mismatch_k3_sum"] == pytest.approx(2 * float(k3.sum()))

    plain, plain_sums = _gradient("none", ratios, advantages)
    # A > 0: ratios above 1 + 0.2 are clipped (no gradient); A < 0: ratios below 0.8 are
    inside_high, inside_low = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 1.0, 1.0])
    expected_plain = torch.stack([-1.0 * r * inside_high / tokens, 2.0 * r * inside_low / tokens])
    torch.testing.assert_close(plain, expected_plain, rtol=1e-6, atol=1e-7)
    assert plain_sums["is_capped_tokens"] == 0.0
    assert plain_sums["mismatch_ratio_max"] == pytest.approx(3.0)  # measured either way


def test_with_matching_log_probs_the_correction_changes_nothing() -> None:
    on_policy, _ = _gradient("tis", [1.0, 1.0, 1.0], [1.0, -0.5])
    plain, _ = _gradient("none", [1.0, 1.0, 1.0], [1.0, -0.5])
    torch.testing.assert_close(on_policy, plain)


def test_mismatch_is_measured_on_trained_tokens_only() -> None:
    behaviour = torch.tensor([[0.0, -1.0, -1.0]])  # the prompt position carries no behaviour
    logp = torch.tensor([[-9.0, -1.0, -1.2]])
    _, sums = policy_loss(
        LossInputs(logp, behaviour, torch.tensor([1.0]), torch.tensor([[0.0, 1.0, 1.0]])),
        LossConfig(type="dapo", clip_low=0.2, clip_high=0.2, importance_correction="tis"),
        LossNorm(1, 1, 2, 3),
    )
    assert sums["mismatch_ratio_max"] == pytest.approx(1.0)
    assert sums["mismatch_ratio_min"] == pytest.approx(math.exp(-0.2))


def test_micro_batches_add_up_to_the_full_batch_loss() -> None:
    torch.manual_seed(0)
    logp = torch.randn(6, 5)
    old = logp + 0.1 * torch.randn(6, 5)
    adv = torch.randn(6)
    mask = (torch.rand(6, 5) > 0.3).float()
    norm = LossNorm(
        sequences=int((mask.sum(-1) > 0).sum()),
        all_sequences=6,
        tokens=int(mask.sum()),
        max_tokens=5,
    )
    for kind in ("grpo", "dr_grpo", "dapo"):
        cfg = LossConfig(type=kind, clip_low=0.2, clip_high=0.28, importance_correction="none")
        full, _ = policy_loss(LossInputs(logp, old, adv, mask), cfg, norm)
        parts = sum(
            float(
                policy_loss(
                    LossInputs(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2]),
                    cfg,
                    norm,
                )[0]
            )
            for i in range(0, 6, 2)
        )
        assert parts == pytest.approx(float(full), abs=1e-6)


# --------------------------------------------------------------------------- masking


def _grads(model: Any, seq: Sequence, advantage: float = 1.0) -> torch.Tensor:
    """Gradient of the GRPO loss for one sequence, through the recipe's own padding."""
    model.zero_grad(set_to_none=True)
    ids, attention, mask, _old = _pad([seq], _Tok(), "cpu")
    logp, _ = token_logprobs(model, ids, attention, 1.0)
    loss, _ = policy_loss(
        # slightly off-policy, within the clip range
        LossInputs(logp, logp.detach() - 0.05, torch.tensor([advantage]), mask),
        LossConfig(type="grpo", clip_low=0.2, clip_high=0.2, importance_correction="none"),
        LossNorm(1, 1, int(mask.sum()), 8),
    )
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


class _Tok:
    pad_token_id = 0


def test_environment_and_tool_tokens_do_not_change_the_gradient(tiny: tuple[Any, Any]) -> None:
    """A rollout ending with environment/tool tokens (e.g. a tool reply the turn limit cut
    off): editing them leaves the gradient unchanged; editing assistant tokens changes it.

    (Environment tokens *between* assistant turns are context for the later turns, so
    they rightly change those turns' log-probabilities; they are never loss targets,
    which the trailing case isolates.)
    """
    model = copy.deepcopy(tiny[0]).float()
    prompt, assistant, env = [5, 6, 7, 8], [40, 41, 42], [60, 61, 62, 63]

    def seq(asst: list[int], env_tokens: list[int]) -> Sequence:
        ids = [*prompt, *asst, *env_tokens]
        mask = [0] * len(prompt) + [1] * len(asst) + [0] * len(env_tokens)
        return Sequence(ids, mask, [0.0] * len(ids), 0)

    base = _grads(model, seq(assistant, env))
    other_env = _grads(model, seq(assistant, [90, 91, 92, 93]))
    other_asst = _grads(model, seq([40, 99, 42], env))
    assert torch.equal(base, other_env)
    assert not torch.allclose(base, other_asst)


def test_rollout_sequences_mask_env_tokens_between_turns() -> None:
    turns = [
        {"prompt_ids": [1, 2], "completion_ids": [3, 4], "completion_logprobs": [-0.1, -0.2],
         "temperature": 1.0, "policy_version": 3},
        {"prompt_ids": [1, 2, 3, 4, 9, 9], "completion_ids": [5], "completion_logprobs": [-0.3],
         "temperature": 1.0, "policy_version": 4},
    ]  # fmt: skip
    (merged,) = rollout_sequences(turns)  # type: ignore[arg-type]
    assert merged.input_ids == [1, 2, 3, 4, 9, 9, 5]
    assert merged.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert merged.old_logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3]
    assert merged.policy_version == 3
    turns[1]["prompt_ids"] = [1, 2, 7, 9, 9]  # the template rewrote turn 1: split per turn
    first, second = rollout_sequences(turns)  # type: ignore[arg-type]
    assert first.input_ids == [1, 2, 3, 4] and second.input_ids == [1, 2, 7, 9, 9, 5]
    assert second.loss_mask == [0, 0, 0, 0, 0, 1]


# --------------------------------------------------------------------------- multi-turn tokens

THINKING = "<think>\nseven is lucky\n</think>\n7"


def _conversation(
    tokenizer: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any], list[int], list[int]]:
    messages = [{"role": "system", "content": "Reply."}, {"role": "user", "content": "Digit?"}]
    p1 = prompt_ids(tokenizer, messages)
    c1 = [*encode(tokenizer, THINKING), int(tokenizer.convert_tokens_to_ids("<|im_end|>"))]
    return messages, {"role": "assistant", "content": THINKING}, p1, c1


def test_detects_a_template_that_breaks_the_incremental_prefix(
    tiny: tuple[Any, Any], qwen_like: Any
) -> None:
    messages, assistant, _, _ = _conversation(qwen_like)
    convo = [*messages, assistant, {"role": "user", "content": "Again?"}]
    assert prefix_breaks(qwen_like, convo) == [2]
    assert prefix_breaks(tiny[1], convo) == []  # plain ChatML keeps the prefix
    rendered = render(qwen_like, convo, add_generation_prompt=True)
    assert "seven is lucky" not in rendered


def _second_turn(backend: HFBackend, tokenizer: Any) -> tuple[Any, list[int], list[int]]:
    messages, assistant, p1, c1 = _conversation(tokenizer)
    follow = [*messages, assistant, {"role": "user", "content": "Again?"}]

    # Turn 1 as the backend remembers it (its sampled text is fixed here so that it
    # contains a <think> block); turn 2 goes through the real client.
    backend.client.memory.remember(messages, None, assistant, Turn.of(p1, c1))  # type: ignore[attr-defined]

    async def rollout() -> Any:
        return await backend.client.chat(
            model="m", messages=follow, sampling_args={"max_tokens": 3, "seed": 1}
        )

    return asyncio.run(rollout()), p1, c1


def test_continue_mode_trains_on_exactly_the_sampled_tokens(
    tiny: tuple[Any, Any], qwen_like: Any
) -> None:
    backend = HFBackend(tiny[0], qwen_like, multiturn_tokens="continue")
    response, p1, c1 = _second_turn(backend, qwen_like)
    tokens = response.raw[TOKENS_KEY]
    assert tokens["prompt_ids"][: len(p1) + len(c1)] == p1 + c1  # the think block is kept
    suffix = qwen_like.decode(tokens["prompt_ids"][len(p1) + len(c1) :])
    assert suffix == "\n<|im_start|>user\nAgain?<|im_end|>\n<|im_start|>assistant\n"
    assert response.raw["prefix_consistent"] is False and backend.prefix_breaks == 1
    first = {"prompt_ids": p1, "completion_ids": c1, "completion_logprobs": [0.0] * len(c1),
             "temperature": 1.0, "policy_version": 0}  # fmt: skip
    (merged,) = rollout_sequences([first, tokens])  # type: ignore[list-item]
    trained = [t for t, m in zip(merged.input_ids, merged.loss_mask, strict=True) if m]
    assert trained == [*c1, *tokens["completion_ids"]]


def test_retokenize_mode_splits_the_rollout_per_turn(tiny: tuple[Any, Any], qwen_like: Any) -> None:
    backend = HFBackend(tiny[0], qwen_like, multiturn_tokens="retokenize")
    response, p1, c1 = _second_turn(backend, qwen_like)
    tokens = response.raw[TOKENS_KEY]
    messages, assistant, _, _ = _conversation(qwen_like)
    follow = [*messages, assistant, {"role": "user", "content": "Again?"}]
    assert tokens["prompt_ids"] == prompt_ids(qwen_like, follow)  # what a plain server sees
    first = {"prompt_ids": p1, "completion_ids": c1, "completion_logprobs": [0.0] * len(c1),
             "temperature": 1.0, "policy_version": 0}  # fmt: skip
    sequences = rollout_sequences([first, tokens])  # type: ignore[list-item]
    assert len(sequences) == 2
    assert sequences[1].input_ids == [*tokens["prompt_ids"], *tokens["completion_ids"]]


def test_multiturn_env_rollouts_are_token_in_token_out(tiny: tuple[Any, Any]) -> None:
    """Real rollouts of a 3-turn environment: each turn continues the exact tokens."""
    from datasets import Dataset

    import vfops

    class Nag(vfops.MultiTurnEnv):
        async def env_response(self, messages: Any, state: Any) -> Any:
            return [{"role": "user", "content": "Try again."}]

    env = Nag(dataset=Dataset.from_list([{"question": "Digit?"}]), max_turns=3)
    backend = HFBackend(tiny[0], tiny[1])
    example = next(iter(env.iter_eval_examples(1)))

    async def run() -> Any:
        return await env.run_group_states(
            backend.client, "m", example, range(4), sampling_args={"max_tokens": 4, "seed": 3}
        )

    states, _ = asyncio.run(run())
    for state in states:
        turns = [r.raw[TOKENS_KEY] for r in state["responses"]]
        for before, after in itertools.pairwise(turns):
            assert after["prompt_ids"][: len(before["prompt_ids"])] == before["prompt_ids"]
        assert len(rollout_sequences(turns)) == 1
        for turn in turns:
            assert len(turn["completion_logprobs"]) == len(turn["completion_ids"])
            assert all(lp <= 0.0 for lp in turn["completion_logprobs"])
    assert backend.prefix_breaks == 0
    texts = {s["completion"][0]["content"] for s in states}
    assert len(texts) > 1  # rollouts of a group draw different samples


def _follow_up(tokenizer: Any) -> tuple[list[dict[str, Any]], list[int], list[int], dict[str, Any]]:
    """Turn 1 of a conversation (think block, fixed sampled ids) and the messages of turn 2."""
    messages, assistant, p1, c1 = _conversation(tokenizer)
    return [*messages, assistant, {"role": "user", "content": "Again?"}], p1, c1, assistant


def test_both_backends_continue_turns_the_same_way(
    tiny: tuple[Any, Any], qwen_like: Any, tmp_path: Path
) -> None:
    """One strategy: the hf and vLLM clients remember turns in the same TurnMemory and
    build the same continued prompt, even under a template that rewrites earlier turns."""
    from vfops.training._continuation import TurnMemory
    from vfops.training._vllm import VLLMBackend, VLLMGenerationConfig

    follow, p1, c1, assistant = _follow_up(qwen_like)
    hf = HFBackend(tiny[0], qwen_like)
    config = VLLMGenerationConfig(base_url="http://127.0.0.1:9", sync_dir=str(tmp_path / "s"))
    vllm = VLLMBackend(config, qwen_like)
    memories = [hf.client.memory, vllm.vllm_client.memory]  # type: ignore[attr-defined]
    assert all(isinstance(m, TurnMemory) for m in memories)
    for memory in memories:
        memory.remember(follow[:2], None, assistant, Turn.of(p1, c1))
    hf_prompt = hf.client.memory.prompt(follow, None, take=False)  # type: ignore[attr-defined]
    vllm_ids, source = vllm.vllm_client.prompt_ids(follow)
    asyncio.run(vllm.aclose())
    assert (hf_prompt.source, source) == ("continued", "continued")
    assert vllm_ids == hf_prompt.ids and vllm_ids[: len(p1) + len(c1)] == p1 + c1
    # retokenize: both render the messages (what a stateless server sees)
    hf = HFBackend(tiny[0], qwen_like, multiturn_tokens="retokenize")
    vllm = VLLMBackend(config, qwen_like, multiturn_tokens="retokenize")
    for memory in (hf.client.memory, vllm.vllm_client.memory):  # type: ignore[attr-defined]
        memory.remember(follow[:2], None, assistant, Turn.of(p1, c1))
    rendered = prompt_ids(qwen_like, follow)
    assert hf.client.memory.prompt(follow, None).ids == rendered  # type: ignore[attr-defined]
    assert vllm.vllm_client.prompt_ids(follow) == (rendered, "rendered")
    asyncio.run(vllm.aclose())


def test_a_turn_continues_whatever_task_or_loop_runs_it(tiny: tuple[Any, Any]) -> None:
    """Turns of one rollout on different event loops (so different tasks and contexts)
    still continue the exact tokens: the conversation, not the task, finds the turn."""
    backend = HFBackend(tiny[0], tiny[1])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Digit?"}]
    args = {"max_tokens": 4, "seed": 2}
    first = asyncio.run(backend.client.chat(model="m", messages=messages, sampling_args=args))
    follow = [*messages, first.message, {"role": "user", "content": "Again?"}]
    second = asyncio.run(backend.client.chat(model="m", messages=follow, sampling_args=args))
    t1, t2 = first.raw[TOKENS_KEY], second.raw[TOKENS_KEY]
    assert second.raw["vfops_prompt_source"] == "continued"
    assert t2["prompt_ids"][: len(t1["prompt_ids"]) + len(t1["completion_ids"])] == [
        *t1["prompt_ids"],
        *t1["completion_ids"],
    ]


def test_rollouts_that_read_the_same_each_continue_their_own_turn(tiny: tuple[Any, Any]) -> None:
    """Two rollouts whose turn 1 decodes to the same text (different token ids): each
    turn 2 continues one of them, not both the same; a third finds none left."""
    tokenizer = tiny[1]
    follow, p1, c1, assistant = _follow_up(tokenizer)
    eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    per_char = [int(tokenizer.convert_tokens_to_ids(c)) for c in "seven"]
    odd = [*encode(tokenizer, "<think>\n"), *per_char, *encode(tokenizer, THINKING[13:]), eos]
    assert odd != c1 and tokenizer.decode(odd) == tokenizer.decode(c1)
    backend = HFBackend(tiny[0], tokenizer)
    memory = backend.client.memory  # type: ignore[attr-defined]
    memory.remember(follow[:2], None, assistant, Turn.of(p1, c1, conversation=0))
    memory.remember(follow[:2], None, assistant, Turn.of(p1, odd, conversation=1))

    async def group() -> list[Any]:
        args = {"max_tokens": 3, "seed": 1}
        return list(
            await asyncio.gather(
                *(backend.client.chat(model="m", messages=follow, sampling_args=args)
                  for _ in range(3))
            )
        )  # fmt: skip

    responses = asyncio.run(group())
    sources = [r.raw["vfops_prompt_source"] for r in responses]
    assert sources == ["continued", "continued", "rendered"]
    prompts = [r.raw[TOKENS_KEY]["prompt_ids"] for r in responses]
    assert prompts[0][len(p1) : len(p1) + len(c1)] == c1
    assert prompts[1][len(p1) : len(p1) + len(odd)] == odd
    # each continues its own seed stream: same prompt text, different draws
    assert prompts[0] != prompts[1]


def test_sampling_is_reproducible_per_seed(tiny: tuple[Any, Any]) -> None:
    async def sample(backend: HFBackend, seed: int) -> list[int]:
        async def one() -> list[int]:
            r = await backend.client.chat(
                model="m",
                messages=[{"role": "user", "content": "Hi"}],
                sampling_args={"max_tokens": 6, "seed": seed},
            )
            return list(r.raw[TOKENS_KEY]["completion_ids"])

        return await asyncio.create_task(one())

    a = asyncio.run(sample(HFBackend(tiny[0], tiny[1]), 5))
    b = asyncio.run(sample(HFBackend(tiny[0], tiny[1]), 5))
    c = asyncio.run(sample(HFBackend(tiny[0], tiny[1]), 6))
    assert a == b and a != c


def test_unsupported_sampling_args_are_refused(tiny: tuple[Any, Any]) -> None:
    backend = HFBackend(tiny[0], tiny[1])

    async def call() -> Any:
        return await backend.client.chat(
            model="m", messages=[{"role": "user", "content": "x"}], sampling_args={"top_p": 0.5}
        )

    with pytest.raises(ValueError, match="top_p"):
        asyncio.run(call())


def test_weight_sync_changes_generation_and_version(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    model = copy.deepcopy(tiny[0])
    backend = HFBackend(model, tiny[1])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    seconds = asyncio.run(backend.sync_weights(model, 7))
    assert seconds >= 0.0 and backend.policy_version == 7
    for (name, mine), theirs in zip(
        backend.model.state_dict().items(), model.state_dict().values(), strict=True
    ):
        assert torch.equal(mine, theirs), name


def test_logprobs_skip_the_untrained_prefix(tiny: tuple[Any, Any]) -> None:
    """Only positions from the first trained token get logits; the values are the same."""
    model = copy.deepcopy(tiny[0]).float()
    ids = torch.tensor([[5, 6, 7, 8, 40, 41, 42], [5, 6, 7, 9, 43, 44, 0]])
    attention = torch.tensor([[1] * 7, [1] * 6 + [0]])
    full, full_entropy = token_logprobs(model, ids, attention, 0.7)
    part, part_entropy = token_logprobs(model, ids, attention, 0.7, start=3)
    assert part.shape == (2, 3)
    torch.testing.assert_close(part, full[:, 3:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(part_entropy, full_entropy[:, 3:], rtol=1e-5, atol=1e-6)
