"""The loss variants, each against a hand-computed example, and the seam they come
through (``vfops.losses`` entry points: a package adds a variant with no edit to vfops).

Two sequences throughout: the first trains on two tokens, the second on one (mask
``[[1, 1], [1, 0]]``), advantages ``A = [1, -1]``; ``d = logp - logp_old`` per token.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vfops._errors import InvalidArgumentError
from vfops.rubrics import RolloutScore
from vfops.training import (
    TOKENS_KEY,
    LossConfig,
    LossInputs,
    LossNorm,
    loss_names,
    policy_loss,
)
from vfops.training._batch import to_batch
from vfops.training._loss_names import check_loss_name

MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])
NORM = LossNorm(sequences=2, all_sequences=2, tokens=3, max_tokens=4)


def run(
    kind: str, d: list[list[float]], **config: Any
) -> tuple[float, list[list[float]], dict[str, float]]:
    """The loss, d loss / d logp per token, and the sums, for log-ratios ``d``."""
    behaviour = torch.zeros(2, 2)
    logp = torch.tensor(d, requires_grad=True)
    settings = {"importance_correction": "none", **config}
    loss, sums = policy_loss(
        LossInputs(logp, behaviour, ADV, MASK), LossConfig(type=kind, **settings), NORM
    )
    loss.backward()
    assert logp.grad is not None
    return float(loss.detach()), (logp.grad * MASK).flatten().tolist(), sums


def test_dapo_is_a_token_mean_over_the_step() -> None:
    # on-policy: per token -A; (-1 - 1 + 1) / 3 tokens; each token's gradient -A / 3
    loss, grad, _ = run("dapo", [[0.0, 0.0], [0.0, 0.0]])
    assert loss == pytest.approx(-1 / 3)
    assert grad == pytest.approx([-1 / 3, -1 / 3, 1 / 3, 0.0])
    grpo, _, _ = run("grpo", [[0.0, 0.0], [0.0, 0.0]])
    assert grpo == pytest.approx(0.0)  # per-sequence means -1 and +1, averaged


def test_dapo_clips_higher_by_default() -> None:
    # d = 0.24 on the first token: r = e^0.24 = 1.271, past grpo's 1.2, inside DAPO's 1.28
    _, dapo, dapo_sums = run("dapo", [[0.24, 0.0], [0.0, 0.0]])
    _, grpo, grpo_sums = run("grpo", [[0.24, 0.0], [0.0, 0.0]])
    assert dapo[0] == pytest.approx(-math.exp(0.24) / 3)  # still learning
    assert grpo[0] == 0.0  # clipped at 1.2: no gradient
    assert (dapo_sums["clipped_tokens"], grpo_sums["clipped_tokens"]) == (0.0, 1.0)


def test_gspo_clips_the_sequence_ratio() -> None:
    # s_0 = exp(mean(0.1, 0.3)) = e^0.2, A = +1: clipped at 1 + 4e-4 (no gradient);
    # s_1 = exp(0.2), A = -1: -min(-s, -clip(s)) = s (unclipped side, gradient s / 2)
    loss, grad, sums = run("gspo", [[0.1, 0.3], [0.2, 0.0]])
    s = math.exp(0.2)
    assert loss == pytest.approx((-(1 + 4e-4) + s) / 2)
    assert grad == pytest.approx([0.0, 0.0, s / 2, 0.0])
    # the metric counts ratios outside the range (both sequences' here), as for tokens
    assert sums["clipped_tokens"] == 3.0


def test_cispo_weighs_every_token_by_a_clipped_stopped_weight() -> None:
    # r_00 = e^0.5 = 1.65 -> 1.28 (0.28 above 1), others 1; gradient -w A / 3, never 0
    _, grad, sums = run("cispo", [[0.5, 0.0], [0.0, 0.0]])
    assert grad == pytest.approx([-1.28 / 3, -1 / 3, 1 / 3, 0.0])
    assert sums["clipped_tokens"] == 1.0
    # the weight has no lower bound: r = e^-1 trains at 0.37 (PPO would clip at 0.8)
    _, low, _ = run("cispo", [[-1.0, 0.0], [0.0, 0.0]])
    assert low[0] == pytest.approx(-math.exp(-1.0) / 3)


def test_mis_leaves_out_tokens_the_sampler_disagrees_on_and_tis_caps_them() -> None:
    # trainer vs sampler log-ratio log 3 on the first token: weight 3 > cap 2
    behaviour = torch.tensor([[-math.log(3.0), 0.0], [0.0, 0.0]])
    results = {}
    for correction in ("mis", "tis"):
        logp = torch.zeros(2, 2, requires_grad=True)
        config = LossConfig(type="dapo", importance_correction=correction, importance_cap=2.0)
        loss, sums = policy_loss(LossInputs(logp, behaviour, ADV, MASK), config, NORM)
        loss.backward()
        assert logp.grad is not None
        results[correction] = (float(loss.detach()), (logp.grad * MASK).flatten().tolist(), sums)
    loss, grad, sums = results["mis"]
    assert loss == pytest.approx(0.0)  # (0 - 1 + 1) / 3: the first token left out
    assert grad == pytest.approx([0.0, -1 / 3, 1 / 3, 0.0])
    assert sums["is_capped_tokens"] == 1.0 and sums["is_weight_sum"] == pytest.approx(2.0)
    loss, grad, _ = results["tis"]
    assert loss == pytest.approx(-2 / 3)  # (-2 - 1 + 1) / 3: capped at 2
    assert grad == pytest.approx([-2 / 3, -1 / 3, 1 / 3, 0.0])


def _state(reward: float) -> tuple[dict[str, Any], RolloutScore]:
    tokens = {"prompt_ids": [1, 2], "completion_ids": [3, 4], "completion_logprobs": [-0.1, -0.2],
              "temperature": 1.0, "policy_version": 0}  # fmt: skip
    response = SimpleNamespace(raw={TOKENS_KEY: tokens})
    return {"responses": [response], "stop_reason": "completed"}, RolloutScore(reward=reward)


def _groups(*rewards: list[float]) -> list[tuple[list[Any], list[RolloutScore]]]:
    groups = []
    for group in rewards:
        pairs = [_state(r) for r in group]
        groups.append(([s for s, _ in pairs], [score for _, score in pairs]))
    return groups


def test_dapo_leaves_out_groups_without_signal() -> None:
    groups = _groups([1.0, 1.0], [1.0, 0.0])  # the first group's rewards are all equal
    dapo = to_batch(0, groups, 0.0, LossConfig(type="dapo"))
    assert dapo.groups_without_signal == 1 and len(dapo.samples) == 2
    assert dapo.rewards == [1.0, 1.0, 1.0, 0.0] and dapo.rollouts == 4  # still counted
    grpo = to_batch(0, groups, 0.0, LossConfig(type="grpo"))
    assert grpo.groups_without_signal == 0 and len(grpo.samples) == 4
    off = to_batch(0, groups, 0.0, LossConfig(type="dapo", dynamic_sampling=False))
    assert len(off.samples) == 4


def test_an_old_or_unknown_name_is_one_line_naming_the_fix() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'bnpo' is now 'dapo'.*type = 'dapo'"):
        check_loss_name("bnpo")
    with pytest.raises(InvalidArgumentError, match=r"unknown loss type 'ppo'; installed: "):
        check_loss_name("ppo")
    assert {"grpo", "dr_grpo", "dapo", "gspo", "cispo"} <= set(loss_names())


PLUGIN = '''
import torch

class HalfDAPO:
    """Half of DAPO's loss: a variant from a package of its own."""
    clip_low = 0.2
    clip_high = 0.28
    dynamic_sampling = False

    def loss(self, inputs, config, norm):
        from vfops.training import loss_variant
        loss, sums = loss_variant("dapo").loss(inputs, config, norm)
        return loss / 2, sums
'''


def test_a_package_adds_a_loss_under_the_entry_point(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "half_loss.py").write_text(PLUGIN)
    dist = site / "half_loss-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: half-loss\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vfops.losses]\nhalf_dapo = half_loss:HalfDAPO\n")
    code = (
        "import torch\n"
        "from vfops.training import LossConfig, LossInputs, LossNorm, policy_loss\n"
        "logp = torch.zeros(1, 2)\n"
        "inputs = LossInputs(logp, logp, torch.tensor([1.0]), torch.ones(1, 2))\n"
        "norm = LossNorm(1, 1, 2, 2)\n"
        "half, _ = policy_loss(inputs, LossConfig(type='half_dapo'), norm)\n"
        "full, _ = policy_loss(inputs, LossConfig(type='dapo'), norm)\n"
        "print(float(half), float(full))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [float(x) for x in done.stdout.split()] == [-0.5, -1.0]


def test_a_later_update_takes_its_ratio_against_the_weights_before_the_first() -> None:
    """``[optim] updates_per_batch > 1``: from the second update on, ``old_logprobs`` are
    the trainer's log-probs before the batch's first step. The ratio is against them, so
    it leaves 1 and the clip binds; the sampler-mismatch weight stays theirs against the
    behaviour log-probs (what it was on the first update), not the moved weights'."""
    behaviour = torch.tensor([[-math.log(3.0), 0.0], [0.0, 0.0]])
    old = torch.zeros(2, 2)
    config = LossConfig(type="dapo", importance_correction="tis", importance_cap=4.0)

    def second_update(d: list[list[float]]) -> tuple[float, list[float], dict[str, float]]:
        logp = torch.tensor(d, requires_grad=True)
        inputs = LossInputs(logp, behaviour, ADV, MASK, old_logprobs=old)
        loss, sums = policy_loss(inputs, config, NORM)
        loss.backward()
        assert logp.grad is not None
        return float(loss.detach()), (logp.grad * MASK).flatten().tolist(), sums

    # logp moved by 0.1 on the first token: r = e^0.1 inside (0.8, 1.28); w = min(3, 4) = 3
    # (e^0.1 * 3 = 3.32 had it been taken against the moved weights)
    loss, grad, sums = second_update([[0.1, 0.0], [0.0, 0.0]])
    r = math.exp(0.1)
    assert loss == pytest.approx((-3 * r - 1 + 1) / 3)
    assert grad == pytest.approx([-3 * r / 3, -1 / 3, 1 / 3, 0.0])
    assert sums["ratio_sum"] == pytest.approx(r + 2) and sums["clipped_tokens"] == 0.0
    # moved by 0.3: r = e^0.3 = 1.35 past DAPO's 1.28 with A = +1: clipped, no gradient
    _, grad, sums = second_update([[0.3, 0.0], [0.0, 0.0]])
    assert grad[0] == 0.0 and sums["clipped_tokens"] == 1.0
    # the same log-probs as a first update (no old_logprobs): r = 1 in value, never clipped
    logp = torch.tensor([[0.3, 0.0], [0.0, 0.0]], requires_grad=True)
    _, first = policy_loss(LossInputs(logp, behaviour, ADV, MASK), config, NORM)
    assert first["clipped_tokens"] == 0.0 and first["ratio_sum"] == pytest.approx(3.0)
