"""The sampling flags every command that samples takes (``-S``, ``-T``, ``-t``), declared
once: ``vfops eval`` and ``vfops promote`` read them the same way."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vfops._jsonarg import parse_json_object

SamplingArgsOption = Annotated[
    str | None,
    typer.Option("--sampling-args", "-S", help="JSON object of sampling arguments."),
]
TemperatureOption = Annotated[
    float | None, typer.Option("--temperature", "-T", help="Sampling temperature.")
]
MaxTokensOption = Annotated[
    int | None, typer.Option("--max-tokens", "-t", help="Max tokens per model turn.")
]


def sampling_from_flags(
    sampling_args: str | None, temperature: float | None, max_tokens: int | None
) -> dict[str, Any]:
    """``-S``'s object with ``-T`` and ``-t`` set over it (the flags win)."""
    sampling = parse_json_object(sampling_args, "--sampling-args")
    if temperature is not None:
        sampling["temperature"] = temperature
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    return sampling
