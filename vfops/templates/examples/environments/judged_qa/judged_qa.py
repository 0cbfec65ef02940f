"""judged_qa: short factual questions graded by an LLM judge.

The questions ship inside this module (no download). The model answers inside
``<answer>...</answer>``; a judge model compares that answer with the reference
and says yes or no (:class:`vfops.JudgeRubric`).
"""

from __future__ import annotations

import os
from typing import Any

import vfops

SYSTEM_PROMPT = (
    "Answer the question briefly. Give only the final answer inside <answer>...</answer>."
)
OPENAI_BASE_URL = "https://api.openai.com/v1"
JUDGE_BASE_URL_VAR = "VFOPS_JUDGE_BASE_URL"

QA_PAIRS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the capital of Australia?", "Canberra"),
    ("What is the capital of Kenya?", "Nairobi"),
    ("What is the capital of Brazil?", "Brasília"),
    ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Norway?", "Oslo"),
    ("What is the capital of Argentina?", "Buenos Aires"),
    ("What is the capital of South Korea?", "Seoul"),
    ("What is the chemical symbol for gold?", "Au"),
    ("What is the chemical symbol for sodium?", "Na"),
    ("What gas do plants absorb from the air for photosynthesis?", "Carbon dioxide (CO2)"),
    ("What is the boiling point of water at sea level in degrees Celsius?", "100 °C"),
    ("How many planets are in the Solar System?", "8"),
    ("Which planet is known as the Red Planet?", "Mars"),
    ("What is the largest planet in the Solar System?", "Jupiter"),
    ("What is the hardest naturally occurring mineral?", "Diamond"),
    ("What part of the cell contains most of its genetic material?", "The nucleus"),
    ("What force keeps the planets in orbit around the Sun?", "Gravity"),
    ("How many bones are in the adult human body?", "206"),
    ("What is the most abundant gas in Earth's atmosphere?", "Nitrogen"),
    ("What is H2O commonly called?", "Water"),
    (
        "What is the speed of light in a vacuum, in kilometres per second (approximately)?",
        "About 300,000 km/s (299,792 km/s)",
    ),
    ("Who wrote the play 'Romeo and Juliet'?", "William Shakespeare"),
    ("Who developed the theory of general relativity?", "Albert Einstein"),
    ("What is the largest ocean on Earth?", "The Pacific Ocean"),
    ("What is the longest river in South America?", "The Amazon"),
    ("How many continents are there on Earth?", "7"),
    ("What is the freezing point of water in degrees Fahrenheit?", "32 °F"),
    ("What organ pumps blood through the human body?", "The heart"),
    ("What is the square root of 144?", "12"),
)


def build_dataset(num_examples: int = -1) -> list[dict[str, Any]]:
    """The shipped Q/A rows (the first ``num_examples``; all when negative)."""
    pairs = QA_PAIRS if num_examples < 0 else QA_PAIRS[:num_examples]
    return [{"question": q, "answer": a} for q, a in pairs]


def make_judge_client(judge_base_url: str | None, judge_api_key_var: str) -> vfops.OpenAIClient:
    """An OpenAIClient for the judge; the key is read from the environment here, once."""
    base_url = judge_base_url or os.environ.get(JUDGE_BASE_URL_VAR) or OPENAI_BASE_URL
    api_key = os.environ.get(judge_api_key_var) or None
    if api_key is None and base_url.rstrip("/") == OPENAI_BASE_URL:
        raise ValueError(
            f"the judge needs an API key: set the environment variable {judge_api_key_var}, "
            f"or point judge_base_url (or {JUDGE_BASE_URL_VAR}) at a local OpenAI-compatible "
            "server, or pass judge_client"
        )
    return vfops.OpenAIClient(base_url, api_key)


def load_environment(
    num_examples: int = -1,
    judge_model: str = "gpt-4.1-mini",
    judge_base_url: str | None = None,
    judge_api_key_var: str = "OPENAI_API_KEY",
    judge_client: Any = None,
    judge_sampling_args: dict[str, Any] | None = None,
    judge_max_concurrent: int = 8,
    format_weight: float = 0.1,
    max_tokens: int | None = 256,
    system_prompt: str = SYSTEM_PROMPT,
) -> vfops.Environment:
    """Build the judged Q/A environment.

    Args:
        num_examples: Rows to use from the shipped set (-1 for all).
        judge_model: Model name sent to the judge endpoint.
        judge_base_url: Judge endpoint; None uses ``$VFOPS_JUDGE_BASE_URL``, else OpenAI.
        judge_api_key_var: Environment variable holding the judge's API key (read now,
            never stored on the environment).
        judge_client: A ready ``ModelClient`` for the judge (then the three above
            except ``judge_model`` are ignored); tests pass a ScriptedClient.
        judge_sampling_args: Sampling arguments of judge calls (default temperature 0).
        judge_max_concurrent: Judge calls in flight at once.
        format_weight: Weight of the <answer>-format reward.
        max_tokens: Default ``max_tokens`` of the answering model (None for the server's).
        system_prompt: The system prompt.
    """
    if num_examples == 0 or num_examples < -1:
        raise ValueError(f"num_examples must be positive or -1 (all), got {num_examples}")
    if judge_client is None:
        judge_client = make_judge_client(judge_base_url, judge_api_key_var)
    parser = vfops.XMLParser(["think", "answer"])
    rubric = vfops.JudgeRubric(
        judge_client=judge_client,
        judge_model=judge_model,
        judge_sampling_args=(
            {"temperature": 0.0} if judge_sampling_args is None else judge_sampling_args
        ),
        parser=parser,
        max_concurrent=judge_max_concurrent,
    )
    if format_weight:
        rubric.add_reward_func(parser.get_format_reward_func(), weight=format_weight)
    return vfops.SingleTurnEnv(
        eval_dataset=lambda: build_dataset(num_examples),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        sampling_args={"max_tokens": max_tokens} if max_tokens else None,
        name="judged_qa",
    )
