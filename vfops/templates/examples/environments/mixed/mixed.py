"""mixed: the arithmetic and guess_number environments behind one dataset.

An :class:`vfops.EnvGroup`: each row's ``task`` (``arithmetic`` or
``guess_number``) routes its rollout and its scoring to that environment, so
each keeps its own prompt, parser, turn logic and rubric.
"""

from __future__ import annotations

from typing import Any

import arithmetic
import guess_number

import vfops

ENV_NAMES = ("arithmetic", "guess_number")


def load_environment(
    num_examples: int | None = None,
    num_train_examples: int | None = None,
    seed: int = 0,
    arithmetic_args: dict[str, Any] | None = None,
    guess_number_args: dict[str, Any] | None = None,
) -> vfops.Environment:
    """Build the group.

    Args:
        num_examples: Eval rows per member environment (None: each member's default).
        num_train_examples: Train rows per member environment (None: each member's default).
        seed: Seed passed to both members.
        arithmetic_args: Further ``load_environment`` arguments of arithmetic.
        guess_number_args: Further ``load_environment`` arguments of guess_number.
    """
    shared: dict[str, Any] = {"seed": seed}
    if num_examples is not None:
        shared["num_examples"] = num_examples
    if num_train_examples is not None:
        shared["num_train_examples"] = num_train_examples
    members = [
        arithmetic.load_environment(**{**shared, **(arithmetic_args or {})}),
        guess_number.load_environment(**{**shared, **(guess_number_args or {})}),
    ]
    return vfops.EnvGroup(members, env_names=list(ENV_NAMES), name="mixed")
