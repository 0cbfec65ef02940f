"""Build a tiny, random-initialised chat model offline (tokenizer trained locally).

Heavy module: imports ``tokenizers``/``transformers``/``torch`` inside functions
only, and is itself imported lazily by :mod:`vfops.local`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from vfops._errors import InvalidArgumentError, MissingExtraError
from vfops._quiet import name_deepspeed_accelerator

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
"""Special tokens, in id order (ids 0, 1, 2)."""

# ChatML, tool-call friendly. ``tools`` go into the system turn as JSON; an
# assistant's ``tool_calls`` render as ``<tool_call>{json}</tool_call>`` lines;
# ``tool`` messages render as their own ``tool`` turn. ``arguments`` may be a JSON
# string (OpenAI wire format) or a mapping (what ``transformers serve`` passes).
CHAT_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}"
    "{%- for part in content -%}"
    "{%- if part is string -%}{{ part }}"
    "{%- elif part.type == 'text' -%}{{ part.text }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set offset = 0 -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{ render_content(messages[0].content) }}{{ '\\n\\n' }}"
    "{%- set offset = 1 -%}"
    "{%- endif -%}"
    '{{ \'# Tools\\nCall a tool by replying with <tool_call>{"name": ..., "arguments": {...}}\''
    " '</tool_call>. Available tools:' }}"
    "{%- for tool in tools -%}{{ '\\n' }}{{ tool | tojson }}{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and offset == 1) -%}"
    "{{ '<|im_start|>' + message.role + '\\n' }}"
    "{{- render_content(message.content) -}}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if (message.content and message.content is string) or not loop.first -%}"
    "{{ '\\n' }}"
    "{%- endif -%}"
    "{{ '<tool_call>{\"name\": ' }}{{ fn.name | tojson }}{{ ', \"arguments\": ' }}"
    "{%- if fn.arguments is string -%}{{ fn.arguments }}"
    "{%- else -%}{{ fn.arguments | tojson }}{%- endif -%}"
    "{{ '}</tool_call>' }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please reason step by step, then put the final answer in the answer tags.",
    "A reinforcement learning environment scores each completion with a rubric.",
    "The model reads the question and writes a short answer.",
    "Tools return their results as messages from the tool role.",
    "Each rollout ends when the model stops or the turn limit is reached.",
    "Think carefully before you answer the question.",
    "The weather is sunny today, and the river is calm.",
    "She opened the door, looked outside, and smiled at the morning light.",
    "Numbers can be added, subtracted, multiplied and divided.",
    "You are a helpful assistant.",
    "What is the capital of France? The capital of France is Paris.",
    "The answer is correct when it matches the reference exactly.",
    "Call the calculator tool with the expression as its argument.",
    "Write the word in reverse order, one letter at a time.",
    "Good answers are short, clear and correct.",
)
_WORDS = (
    "apple", "river", "stone", "cloud", "green", "seven", "table", "light", "music", "ocean",
    "reward", "policy", "answer", "think", "tool", "model", "prompt", "token", "batch", "score",
)  # fmt: skip
_TAGS = ("think", "answer", "tool_call", "result", "reasoning")


@dataclass(frozen=True, slots=True)
class TinyModelConfig:
    """Shape of the tiny random model built by :func:`build_tiny_model`."""

    vocab_size: int = field(
        default=1024, metadata={"help": "Target BPE vocabulary size (including 256 byte tokens)."}
    )
    hidden_size: int = field(default=128, metadata={"help": "Transformer hidden size."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Number of decoder layers."})
    num_attention_heads: int = field(
        default=2,
        metadata={"help": "Attention heads; head_dim = hidden_size / heads (64 for vLLM CPU)."},
    )
    intermediate_size: int = field(default=256, metadata={"help": "MLP intermediate size."})
    max_position_embeddings: int = field(
        default=2048, metadata={"help": "Maximum context length in tokens (prompt + completion)."}
    )
    max_new_tokens: int = field(
        default=64, metadata={"help": "Default completion cap written to generation_config.json."}
    )
    temperature: float = field(
        default=1.0, metadata={"help": "Default sampling temperature in generation_config.json."}
    )
    corpus_lines: int = field(
        default=3000, metadata={"help": "Number of generated corpus lines the tokenizer trains on."}
    )
    tie_word_embeddings: bool = field(
        default=True,
        metadata={"help": "Share the input embedding with the LM head (as small Qwen models do)."},
    )

    @staticmethod
    def help() -> dict[str, str]:
        """Field name -> help string."""
        return {f.name: str(f.metadata.get("help", "")) for f in fields(TinyModelConfig)}


def _corpus(n_lines: int, seed: int) -> list[str]:
    """A deterministic mixed corpus: arithmetic Q/A, XML tags, ChatML turns, prose, digits."""
    rng = random.Random(seed)
    lines: list[str] = list(_SENTENCES)
    for i in range(n_lines):
        kind = i % 6
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        if kind == 0:
            lines.append(f"Question: What is {a} {op} {b}? Answer: {value}")
        elif kind == 1:
            lines.append(
                f"<think>\nI need {a} {op} {b}. That is {value}.\n</think>\n"
                f"<answer>{value}</answer>"
            )
        elif kind == 2:
            tag = rng.choice(_TAGS)
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))
            lines.append(f"<{tag}>{words}</{tag}>")
        elif kind == 3:
            lines.append(
                f"{IM_START}user\nCompute {a} {op} {b}.{IM_END}\n"
                f"{IM_START}assistant\n<answer>{value}</answer>{IM_END}"
            )
        elif kind == 4:
            args = json.dumps({"expression": f"{a} {op} {b}"})
            lines.append(f'<tool_call>{{"name": "calculator", "arguments": {args}}}</tool_call>')
        else:
            lines.append(
                rng.choice(_SENTENCES) + " " + " ".join(str(rng.randint(0, 9)) for _ in range(8))
            )
    return lines


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Silence transformers' progress bars (weight loading/saving) for the block."""
    hf_logging: Any = importlib.import_module("transformers.utils.logging")

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _require_train_extra() -> None:
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("train", exc.name or "torch") from exc


def build_tokenizer(config: TinyModelConfig, seed: int = 0) -> Any:
    """Train the byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``."""
    _require_train_extra()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tf: Any = importlib.import_module("transformers")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(config.corpus_lines, seed), trainer=trainer)
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=config.max_position_embeddings,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out_dir: str | Path, *, config: TinyModelConfig = TinyModelConfig(), seed: int = 0
) -> Path:
    """Write a tiny random Llama-architecture chat model to ``out_dir`` and return its path.

    Everything is generated locally (nothing is downloaded): a byte-level BPE
    tokenizer trained on a synthetic corpus, a ChatML chat template, random
    weights (``safetensors``) and a ``generation_config.json`` that samples
    (``do_sample=True``) so ``transformers serve`` does not decode greedily.
    Deterministic given ``seed``. Reload with ``AutoTokenizer``/
    ``AutoModelForCausalLM.from_pretrained(out_dir)``.
    """
    _require_train_extra()
    name_deepspeed_accelerator()  # save_pretrained imports DeepSpeed when installed
    import torch

    tf: Any = importlib.import_module("transformers")

    if config.hidden_size % config.num_attention_heads:
        raise InvalidArgumentError("hidden_size must be a multiple of num_attention_heads")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer(config, seed)
    eos_id = int(tokenizer.convert_tokens_to_ids(IM_END))
    pad_id = int(tokenizer.convert_tokens_to_ids(ENDOFTEXT))
    model_config = tf.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=[eos_id, pad_id],
        pad_token_id=pad_id,
        dtype="float32",
    )
    devices: list[torch.device] = []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model: Any = tf.LlamaForCausalLM(model_config)
    model.eval()
    model.generation_config = tf.GenerationConfig(
        do_sample=True,
        temperature=config.temperature,
        top_p=1.0,
        top_k=0,
        max_new_tokens=config.max_new_tokens,
        bos_token_id=None,
        eos_token_id=[eos_id, pad_id],
        pad_token_id=pad_id,
    )
    with quiet_progress():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "vfops_tiny.json").write_text(
        json.dumps({"seed": seed, "config": asdict(config)}, indent=2) + "\n"
    )
    return out


def parameter_count(model_dir: str | Path) -> int:
    """Number of (unique) parameters in the saved ``model.safetensors`` of ``model_dir``."""
    _require_train_extra()
    from safetensors import safe_open

    total = 0
    with safe_open(str(Path(model_dir) / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            shape = f.get_slice(name).get_shape()
            n = 1
            for dim in shape:
                n *= int(dim)
            total += n
    return total
