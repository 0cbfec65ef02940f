"""Padding-free packed micro-batches and the attention kernels (``[optim] packing``,
``[model] attn_implementation``).

The packed path must compute the same loss and gradients as the padded one, sequence for
sequence: checked through the optimiser step's own code on the tiny model in fp32, with
sequences of very different lengths, prompt and environment tokens masked, a sequence with
nothing trained, every loss type, both importance corrections and a reference model.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from vfops.training._attention import AttentionUnavailableError, resolve_attention
from vfops.training._batch import Batch, Sample
from vfops.training._config import ConfigError, GRPOConfig, config_from_dict
from vfops.training._loss import LossNorm, token_logprobs
from vfops.training._optimizer_step import OptimizerStep
from vfops.training._packing import block_causal_mask, pack
from vfops.training._setup import (
    Policy,
    attention,
    build_accelerator,
    load_model,
    prepare_policy,
)
from vfops.training._tokens import Sequence

# trains the tiny model on the CPU: the suite's second pass (tests/conftest.py)
pytestmark = pytest.mark.second_pass

REPO = Path(__file__).resolve().parent.parent
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vfops.local import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


def _config(model_dir: Path, attn: str, **sections: dict[str, Any]) -> GRPOConfig:
    return GRPOConfig(
        model={"path": str(model_dir), "attn_implementation": attn},
        environment={"id": "lucky_digit"},
        generation={
            "prompts_per_step": 3,
            "group_size": 2,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.9,
        },
        loss=sections.get("loss", {}),
        optim={"micro_batch_size": 6, "max_grad_norm": 1e9, **sections.get("optim", {})},
        run={"precision": "fp32", "tracking": False, **sections.get("run", {})},
    )


def _policy(config: GRPOConfig) -> Policy:
    """The policy as the recipe's set-up builds it (accelerate on the CPU)."""
    accelerator, micro_batches = build_accelerator(config)
    attn = attention(config, accelerator)
    model, tokenizer, ref_model = load_model(config, accelerator, attn)
    return prepare_policy(
        config,
        accelerator,
        model,
        tokenizer=tokenizer,
        ref_model=ref_model,
        micro_batches=micro_batches,
        attn_implementation=attn,
    )


def _step(policy: Policy, config: GRPOConfig, *, packing: bool) -> OptimizerStep:
    optim = config.optim.model_copy(update={"packing": packing})
    return OptimizerStep(policy, loss=config.loss, optim=optim, generation=config.generation)


# (prompt, assistant, environment reply, assistant) token counts: lengths 3 to 155, a
# two-turn rollout whose environment reply is masked, and one sequence with nothing
# trained (a truncated completion under mask_truncated)
SHAPES = [(2, 1, 0, 0), (40, 60, 25, 30), (7, 12, 0, 0), (5, 0, 0, 0), (90, 3, 4, 9), (1, 30, 0, 0)]
ADVANTAGES = [1.3, -0.7, 0.4, 0.9, -1.1, 0.2]


def _samples(model: Any, seed: int = 0) -> list[Sample]:
    """Sequences of very different lengths with behaviour log-probs near the model's own
    (so ratios vary around 1 and some clip)."""
    rng = random.Random(seed)
    sequences = []
    for prompt, first, env, second in SHAPES:
        ids = [rng.randrange(3, 1000) for _ in range(prompt + first + env + second)]
        mask = [0] * prompt + [1] * first + [0] * env + [1] * second
        sequences.append(Sequence(ids, mask, [0.0] * len(ids), 0))
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq.input_ids])
            logp, _ = token_logprobs(model, ids, torch.ones_like(ids), 0.9)
            seq.old_logprobs = [0.0] + [
                float(lp) + rng.gauss(0.0, 0.15) if trained else 0.0
                for lp, trained in zip(logp[0].tolist(), seq.loss_mask[1:], strict=True)
            ]
    return [Sample(seq, adv) for seq, adv in zip(sequences, ADVANTAGES, strict=True)]


def _norm(samples: list[Sample]) -> LossNorm:
    return LossNorm(
        sequences=sum(1 for s in samples if s.sequence.completion_tokens),
        all_sequences=len(samples),
        tokens=sum(s.sequence.completion_tokens for s in samples),
        max_tokens=MAX_TOKENS,
    )


def _loss_and_grads(
    step: OptimizerStep, samples: list[Sample]
) -> tuple[float, dict[str, float], torch.Tensor]:
    model = step.policy.model
    model.zero_grad(set_to_none=True)
    loss, sums, _ = step._micro_step(samples, _norm(samples), None)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), sums, grads


# --------------------------------------------------------------------------- packing


def test_a_packed_row_restarts_positions_per_sequence_and_masks_across_them() -> None:
    sequences = [
        Sequence([5, 6, 7], [0, 1, 1], [0.0] * 3, 0),
        Sequence([8, 9], [0, 1], [0.0] * 2, 0),
    ]
    row = pack(sequences, "cpu")
    assert row.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert row.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    # trained next tokens: 6 and 7 (sequence 0, positions 0 and 1), 9 (sequence 1, 0)
    assert row.keep.tolist() == [0, 1, 3] and row.targets.tolist() == [6, 7, 9]
    assert row.sequence.tolist() == [0, 0, 1] and row.offset.tolist() == [0, 1, 0]
    allowed = block_causal_mask(row.position_ids, "sdpa")
    assert allowed is not None and allowed.dtype == torch.bool
    assert allowed[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    additive = block_causal_mask(row.position_ids, "eager")
    assert additive is not None
    assert torch.equal(additive[0, 0] == 0, allowed[0, 0])
    assert bool((additive[0, 0][~allowed[0, 0]] == torch.finfo(torch.float32).min).all())
    # flash-attn's varlen kernel reads the boundaries from position_ids itself
    assert block_causal_mask(row.position_ids, "flash_attention_2") is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(
    ("loss_type", "correction", "beta"),
    [("grpo", "none", 0.0), ("grpo", "tis", 0.1), ("dr_grpo", "tis", 0.0), ("dapo", "none", 0.0)],
)
def test_packed_and_padded_losses_and_gradients_agree(
    tiny_dir: Path, attn: str, loss_type: str, correction: str, beta: float
) -> None:
    """The same micro-batch through the optimiser step padded and packed: the same loss,
    sums (trained tokens, entropy, ratios, clipping, KL, mismatch) and gradient."""
    loss = {"type": loss_type, "importance_correction": correction, "beta": beta}
    config = _config(tiny_dir, attn, loss=loss)
    policy = _policy(config)
    assert policy.model.config._attn_implementation == attn
    if beta > 0:  # move the policy off its reference, so the KL term is not zero
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
    samples = _samples(policy.model)
    padded_loss, padded_sums, padded_grads = _loss_and_grads(
        _step(policy, config, packing=False), samples
    )
    packed_loss, packed_sums, packed_grads = _loss_and_grads(
        _step(policy, config, packing=True), samples
    )
    assert padded_grads.abs().max() > 1e-3  # a gradient worth comparing
    assert (
        padded_sums["tokens"]
        == packed_sums["tokens"]
        == sum(s.sequence.completion_tokens for s in samples)
    )
    assert (
        padded_sums["tokens_total"]
        == packed_sums["tokens_total"]
        == sum(len(s.sequence.input_ids) for s in samples)
    )
    if correction == "none":
        assert padded_sums["clipped_tokens"] > 0  # the clip is exercised
    if beta > 0:
        assert padded_sums["kl_sum"] > 0
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5, abs=1e-7)
    assert set(packed_sums) == set(padded_sums)
    for key, value in padded_sums.items():
        assert packed_sums[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    torch.testing.assert_close(packed_grads, padded_grads, rtol=1e-4, atol=1e-6)


def _record_input_shape(seen: list[tuple[int, ...]]) -> Any:
    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(tuple(kwargs["input_ids"].shape))

    return hook


def test_a_training_step_packs_its_micro_batches(tiny_dir: Path) -> None:
    """``OptimizerStep.run`` with ``packing``: each micro-batch goes through the model as
    one row of its sequences' tokens, and the step's sums and gradient norm are those of
    the padded step from the same weights."""
    config = _config(tiny_dir, "sdpa", optim={"micro_batch_size": 3})
    stats: dict[bool, dict[str, float]] = {}
    shapes: dict[bool, list[tuple[int, ...]]] = {}
    for packing in (False, True):
        policy = _policy(config)
        samples = _samples(policy.model)
        shapes[packing] = seen = []
        policy.model.register_forward_pre_hook(_record_input_shape(seen), with_kwargs=True)
        batch = Batch(0, samples, [0.0] * 6, 0.0, 0, 0, 6, 0)
        stats[packing] = _step(policy, config, packing=packing).run(batch)
    lengths = [len(s.sequence.input_ids) for s in samples]
    assert policy.micro_batches == 2
    assert shapes[True] == [(1, sum(lengths[:3])), (1, sum(lengths[3:]))]
    assert shapes[False] == [(3, max(lengths[:3])), (3, max(lengths[3:]))]
    assert stats[True]["grad_norm"] > 0
    for key, value in stats[False].items():
        assert stats[True][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


# --------------------------------------------------------------------------- attention


def test_auto_attention_resolves_to_flash_only_with_flash_attn_a_gpu_and_bf16(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vfops.training import _attention

    auto = _config(tiny_dir, "auto")
    assert resolve_attention(auto, cuda=False, mixed_precision="no") == "sdpa"
    assert resolve_attention(_config(tiny_dir, "eager"), cuda=False, mixed_precision="no") == (
        "eager"
    )
    monkeypatch.setattr(_attention, "flash_attn_installed", lambda: True)
    assert resolve_attention(auto, cuda=True, mixed_precision="bf16") == "flash_attention_2"
    assert resolve_attention(auto, cuda=True, mixed_precision="no") == "sdpa"  # fp32
    assert resolve_attention(auto, cuda=False, mixed_precision="no") == "sdpa"
    flash = _config(tiny_dir, "flash_attention_2", run={"precision": "bf16"})
    with pytest.raises(AttentionUnavailableError, match="needs a CUDA GPU"):
        resolve_attention(flash, cuda=False, mixed_precision="no")


def test_flash_attention_in_fp32_is_a_config_error() -> None:
    data = {
        "model": {"path": "m", "attn_implementation": "flash_attention_2"},
        "environment": {"id": "x"},
        "run": {"precision": "fp32"},
    }
    with pytest.raises(ConfigError, match=r"attn_implementation = 'flash_attention_2' needs bf16"):
        config_from_dict(data)


def test_train_asking_for_missing_flash_attn_exits_2_in_one_line_writing_nothing(
    tmp_path: Path,
) -> None:
    """``vfops train`` with ``attn_implementation = "flash_attention_2"`` and no flash-attn:
    exit 2, one line naming the field and both fixes, before torch loads and anything is
    built or written (the tiny model it would build, the output folder, an MLflow run
    under VFOPS_HOME)."""
    config = tmp_path / "flash.toml"
    config.write_text(
        '[model]\npath = "model"\nbuild_tiny_if_missing = true\n'
        'attn_implementation = "flash_attention_2"\n'
        '[environment]\nid = "lucky_digit"\n[run]\noutput_dir = "out"\nsteps = 1\n'
    )
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "VFOPS_TRACKING"}  # tracking on
    env["VFOPS_HOME"] = str(home)
    # as if flash-attn were not installed, whatever this machine has (find_spec -> None);
    # at exit, on stdout: whether torch was ever imported (the check comes before it)
    code = (
        "import atexit, sys\nsys.modules['flash_attn'] = None\n"
        "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
        "from vfops.cli._app import run\n"
        f"sys.argv = ['vfops', 'train', {str(config)!r}]\nrun()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "error: [model] attn_implementation = 'flash_attention_2' but flash-attn is not installed"
    )
    assert "pip install 'vfops[gpu]'" in proc.stderr and "'sdpa'" in proc.stderr
    assert proc.stdout.strip() == "torch imported: False"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flash.toml"] + (
        ["home"] if home.exists() else []
    )
    assert not home.exists() or not any(home.rglob("*")), sorted(home.rglob("*"))


def test_the_policy_and_reference_model_load_with_the_resolved_attention(
    tiny_dir: Path,
) -> None:
    policy = _policy(_config(tiny_dir, "eager", loss={"beta": 0.1}))
    assert policy.attn_implementation == "eager"
    assert policy.model.config._attn_implementation == "eager"
    assert policy.ref_model.config._attn_implementation == "eager"
    resolved = _policy(_config(tiny_dir, "auto"))  # no GPU here
    assert resolved.attn_implementation == resolved.model.config._attn_implementation == "sdpa"


def test_a_run_records_the_resolved_attention(tiny_dir: Path, tmp_path: Path) -> None:
    import lucky_digit

    from vfops.training import GRPORecipe
    from vfops.training._tracking import TrainingTracker

    config = _config(tiny_dir, "auto").with_overrides(
        {"run.tracking": True, "run.output_dir": str(tmp_path / "out")}
    )
    env = lucky_digit.load_environment(num_train_examples=8)
    with GRPORecipe(config, environment=env) as recipe:
        recipe.setup()
        assert isinstance(recipe.tracker, TrainingTracker)
        run = recipe.tracker._client.get_run(recipe.tracker.run_id)
    assert run.data.params["resolved.attn_implementation"] == "sdpa"
    assert run.data.params["config.model.attn_implementation"] == "auto"
    assert run.data.params["config.optim.packing"] == "false"


# --------------------------------------------------------------------------- GPU check


@pytest.mark.timeout(900)
def test_the_gpu_check_rehearsal_measures_packed_and_padded_training(tmp_path: Path) -> None:
    """bench/gpu/gpu_check.py --cpu --skip-vllm: the training-throughput parts a GPU lease
    runs (packed vs padded, per attention implementation) on this CPU at tiny sizes;
    flash-attn, not installed here, is reported as such."""
    out = tmp_path / "gpu_check.json"
    script = REPO / "bench" / "gpu" / "gpu_check.py"
    done = subprocess.run(
        [sys.executable, str(script), "--cpu", "--skip-vllm", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parts = json.loads(out.read_text())["parts"]
    assert set(parts) == {"hf", "train_tokens_sdpa", "train_tokens_flash_attention_2"}, parts
    assert parts["train_tokens_flash_attention_2"] == {"skipped": "flash-attn not installed"}
    sdpa = parts["train_tokens_sdpa"]
    assert sdpa["attn_implementation"] == "sdpa"
    for mode in ("padded", "packed"):
        assert sdpa[mode]["tokens_per_s"] > 0 and len(sdpa[mode]["steps_s"]) >= 2, sdpa
    # the same sequences either way; padding only in the padded micro-batches
    assert sdpa["packed"]["tokens"] == sdpa["padded"]["tokens"]
    assert sdpa["padded"]["computed_tokens"] > sdpa["packed"]["computed_tokens"]
    assert sdpa["packed"]["computed_tokens"] == sdpa["packed"]["tokens"]
    assert sdpa["packed_speedup"] > 0
