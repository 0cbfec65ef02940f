"""A step's batch from episodes of several agents: each seat is its own GRPO group.

A multi-agent ``Env`` (two seats of a zero-sum game) records one trace per seat per
episode. Pooling both seats into one group would compare a seat with its opponent
(zero-sum: the baseline is 0 whatever either plays); each seat is compared with the
same seat's other episodes, and a seat its Env does not train is left out.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vfops.rubrics import RolloutScore
from vfops.training._backend import TOKENS_KEY
from vfops.training._batch import to_batch
from vfops.training._config import LossConfig


def _trace(agent: str, reward: float, token: int, *, trainable: bool = True) -> tuple[Any, Any]:
    turn = {
        "prompt_ids": [1, 2],
        "completion_ids": [token],
        "completion_logprobs": [-0.5],
        "temperature": 1.0,
        "policy_version": 0,
    }
    state = {
        "agent": agent,
        "trainable": trainable,
        "error": None,
        "stop_reason": "completed",
        "responses": [SimpleNamespace(raw={TOKENS_KEY: turn})],
    }
    return state, RolloutScore(reward=reward)


def _advantages(batch: Any) -> dict[int, float]:
    return {s.sequence.input_ids[-1]: s.advantage for s in batch.samples}


def test_each_seat_has_its_own_baseline_and_untrained_seats_are_left_out() -> None:
    # two episodes of one prompt: seat a scores 2 then 0, seat b 0 both times; a judge
    # seat scores both episodes but is not trained
    traces = [
        _trace("a", 2.0, 10), _trace("b", 0.0, 20), _trace("judge", 5.0, 30, trainable=False),
        _trace("a", 0.0, 11), _trace("b", 0.0, 21), _trace("judge", 0.0, 31, trainable=False),
    ]  # fmt: skip
    groups = [([s for s, _ in traces], [r for _, r in traces])]
    batch = to_batch(0, groups, 0.1, LossConfig(scale_rewards=False))
    # a against a's mean (1), b against b's (0): pooled, b's traces would read -0.5 each
    assert _advantages(batch) == {10: 1.0, 11: -1.0, 20: 0.0, 21: 0.0}
    assert batch.rollouts == 4 and sorted(batch.rewards) == [0.0, 0.0, 0.0, 2.0]


def test_one_agent_groups_are_unchanged() -> None:
    traces = [_trace("", 1.0, 10), _trace("", 0.0, 11)]
    groups = [([s for s, _ in traces], [r for _, r in traces])]
    batch = to_batch(0, groups, 0.1, LossConfig(scale_rewards=False))
    assert _advantages(batch) == {10: 0.5, 11: -0.5}
