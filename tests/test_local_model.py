"""The tiny offline model, the in-process LocalModelClient and `transformers serve`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")

pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner

from vfops._errors import InvalidArgumentError, VfopsError
from vfops._net import free_port
from vfops.cli._model import app, serve_command, serve_env
from vfops.clients._base import ModelClient, PromptTooLongError
from vfops.local import LocalModelClient, TinyModelConfig, build_tiny_model
from vfops.local._batched import parse_tool_calls

pytestmark = pytest.mark.train

SERVER_START_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def client(tiny_dir: Path) -> LocalModelClient:
    return LocalModelClient(tiny_dir, max_new_tokens_default=16)


def test_import_is_lazy() -> None:
    code = "import sys, vfops.local; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_missing_torch_raises_missing_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from vfops._errors import MissingExtraError\n"
        "from vfops.local import LocalModelClient, build_tiny_model\n"
        "makers = (lambda: build_tiny_model(sys.argv[1]), lambda: LocalModelClient(sys.argv[1]))\n"
        "for make in makers:\n"
        "    try:\n"
        "        make()\n"
        "    except MissingExtraError as exc:\n"
        "        assert '[train]' in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError('no MissingExtraError')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=60)


def test_config_fields_have_help() -> None:
    helps = TinyModelConfig.help()
    assert helps and all(helps.values())


def test_build_writes_reloadable_model(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (tiny_dir / name).is_file(), name
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert gen["do_sample"] is True
    assert gen["temperature"] == 1.0
    assert gen["max_new_tokens"] == 64
    tok: Any = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    cfg = model.config
    assert cfg.model_type == "llama"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (2, 128, 2)
    assert cfg.hidden_size // cfg.num_attention_heads == 64
    assert cfg.intermediate_size == 256 and cfg.max_position_embeddings == 2048
    assert cfg.tie_word_embeddings
    assert 1000 <= len(tok) <= 2048 and model.get_input_embeddings().num_embeddings == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert gen["pad_token_id"] == tok.pad_token_id
    assert tok.eos_token_id in gen["eos_token_id"]
    for text in (
        "What is 12 + 7? <think>12 + 7 = 19</think>\n<answer>19</answer>",
        "Plain English, unicode: café ✓ 你好 and digits 0123456789.",
    ):
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    assert len(tok.encode("<|im_start|>", add_special_tokens=False)) == 1


def test_chat_template_renders_all_roles(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "assistant", "content": "<answer>5</answer>"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\n5<|im_end|>\n"
        "<|im_start|>assistant\n<answer>5</answer><|im_end|>\n"
    )
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    prompt = tok.apply_chat_template(
        messages[:2], tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(tools[0]) in prompt
    assert prompt.count("<|im_start|>system") == 1
    assert prompt.endswith("<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n")
    # arguments as a mapping (what `transformers serve` passes) render the same
    as_dict = [dict(messages[2], tool_calls=[{"function": {"name": "add", "arguments": {"a": 2}}}])]
    assert '{"name": "add", "arguments": {"a": 2}}' in tok.apply_chat_template(
        as_dict, tokenize=False
    )
    # multi-turn prefix property: earlier turns render identically
    assert text.startswith(tok.apply_chat_template(messages[:2], tokenize=False))


async def test_local_client_samples_and_caps_tokens(client: LocalModelClient) -> None:
    assert isinstance(client, ModelClient)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    resp = await client.chat(
        model="tiny", messages=messages, sampling_args={"temperature": 1.0, "max_tokens": 4}
    )
    assert resp.message["role"] == "assistant"
    assert isinstance(resp.message["content"], str)
    assert resp.prompt_tokens > 5
    assert resp.finish_reason in {"length", "stop"}
    assert 1 <= resp.completion_tokens <= 4
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    with_tools = await client.chat(
        model="tiny", messages=messages, sampling_args={"max_tokens": 3}, tools=tools
    )
    assert with_tools.prompt_tokens > resp.prompt_tokens
    # an eos-free completion at the cap is reported as `length`
    lengths = [
        await client.chat(
            model="tiny", messages=messages, sampling_args={"max_completion_tokens": 2, "seed": i}
        )
        for i in range(4)
    ]
    assert any(r.finish_reason == "length" and r.completion_tokens == 2 for r in lengths)
    assert all(r.completion_tokens <= 2 for r in lengths)


async def test_local_client_seed_is_deterministic(client: LocalModelClient) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    args = {"temperature": 1.0, "max_tokens": 12, "seed": 1234}
    a = await client.chat(model="tiny", messages=messages, sampling_args=args)
    b = await client.chat(model="tiny", messages=messages, sampling_args=args)
    c = await client.chat(model="tiny", messages=messages, sampling_args={**args, "seed": 99})
    assert a.message == b.message
    assert a.raw is not None and b.raw is not None and c.raw is not None
    assert a.raw["completion_ids"] == b.raw["completion_ids"]
    assert c.raw["completion_ids"] != a.raw["completion_ids"]
    greedy = {"temperature": 0.0, "max_tokens": 6}
    g1 = await client.chat(model="tiny", messages=messages, sampling_args=greedy)
    g2 = await client.chat(model="tiny", messages=messages, sampling_args=greedy)
    assert g1.message == g2.message


async def test_local_client_batches_concurrent_requests(client: LocalModelClient) -> None:
    before = client.batches_run
    prompts = [[{"role": "user", "content": "x " * (i + 1)}] for i in range(12)]
    results = await asyncio.gather(
        *(client.chat(model="tiny", messages=m, sampling_args={"max_tokens": 8}) for m in prompts)
    )
    assert len(results) == 12
    assert all(r.message["role"] == "assistant" and r.completion_tokens <= 8 for r in results)
    assert [r.prompt_tokens for r in results] == sorted(r.prompt_tokens for r in results)
    assert client.batches_run - before < 12  # some requests shared a generate() call


def test_local_client_and_trainer_share_the_generator_and_its_draws(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LocalModelClient and the trainer's hf backend sample through the one
    BatchedGenerator, and the same seed gives them the same tokens."""
    import transformers

    from vfops.local._batched import BatchedGenerator
    from vfops.training import TOKENS_KEY, HFBackend

    sampled_by: list[BatchedGenerator] = []
    original = BatchedGenerator.sample

    def recording(self: BatchedGenerator, batch: list[Any]) -> Any:
        sampled_by.append(self)
        return original(self, batch)

    monkeypatch.setattr(BatchedGenerator, "sample", recording)
    local = LocalModelClient(tiny_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir), local_files_only=True)
    trainer = HFBackend(model, local.tokenizer)
    messages = [{"role": "user", "content": "Say something."}]

    async def both(seed: int) -> tuple[list[int], list[int]]:
        args = {"temperature": 1.0, "max_tokens": 12, "seed": seed}
        a = await local.chat(model="m", messages=messages, sampling_args=args)
        b = await trainer.client.chat(model="m", messages=messages, sampling_args=args)
        assert a.raw is not None and b.raw is not None
        return a.raw["completion_ids"], b.raw[TOKENS_KEY]["completion_ids"]

    local_ids, trainer_ids = asyncio.run(both(7))
    assert sampled_by == [local.generator, trainer.generator]
    assert len(local_ids) > 1 and local_ids == trainer_ids
    other, _ = asyncio.run(both(8))
    assert other != local_ids


async def test_local_client_truncation_and_penalty(client: LocalModelClient) -> None:
    """top-k 1, a tiny top-p and min-p 1 leave only the best token: greedy; a huge
    repetition penalty never repeats a token the prompt or completion already has."""
    messages = [{"role": "user", "content": "Count: 1 2 3 4 5 6 7 8 9"}]

    async def ids(**args: Any) -> list[int]:
        resp = await client.chat(
            model="m", messages=messages, sampling_args={"max_tokens": 10, **args}
        )
        assert resp.raw is not None
        return list(resp.raw["completion_ids"])

    greedy = await ids(temperature=0.0)
    for cut in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        assert await ids(temperature=1.5, seed=3, **cut) == greedy, cut
    assert await ids(temperature=1.5, seed=3) != greedy
    penalised = await ids(temperature=0.0, repetition_penalty=1e6)
    prompt = client._encode(messages, None)
    assert not set(penalised) & set(prompt) and len(set(penalised)) == len(penalised)


async def test_local_client_batches_rows_with_different_settings(
    client: LocalModelClient,
) -> None:
    before = client.batches_run
    settings: list[dict[str, Any]] = [
        {"temperature": 0.0, "max_tokens": 3},
        {"temperature": 0.7, "max_tokens": 5, "top_p": 0.9},
        {"temperature": 1.3, "max_tokens": 2, "top_k": 20, "repetition_penalty": 1.2},
        {"temperature": 1.5, "max_tokens": 3, "top_k": 1},
        {"temperature": 1.5, "max_tokens": 3, "min_p": 1.0, "top_p": 0.5},
    ]
    results = await asyncio.gather(
        *(
            client.chat(model="m", messages=[{"role": "user", "content": "x"}], sampling_args=a)
            for a in settings
        )
    )
    assert client.batches_run - before == 1  # one batch, each row with its own settings
    for resp, args in zip(results, settings, strict=True):
        assert resp.raw is not None and resp.raw["batch_size"] == len(settings)
        assert 1 <= resp.completion_tokens <= args["max_tokens"]
    # the rows cut to their best token sample greedily; the others' cut-offs do not leak
    greedy = results[0].raw["completion_ids"]  # type: ignore[index]
    assert [r.raw["completion_ids"] for r in results[3:]] == [greedy, greedy]  # type: ignore[index]


async def test_a_rows_cut_offs_do_not_change_its_batch_mates(client: LocalModelClient) -> None:
    from vfops.local._batched import Sampling

    generator = client.generator
    prompt = client._encode([{"role": "user", "content": "x"}], None)
    plain = Sampling(max_new_tokens=6, seed=11, temperature=1.0)

    async def plain_row_with(other: Sampling) -> tuple[list[int], list[float]]:
        rows = await asyncio.gather(
            generator.generate(prompt, plain), generator.generate(prompt, other)
        )
        assert rows[0].batch_size == 2
        return rows[0].token_ids, rows[0].logprobs

    neutral = Sampling(max_new_tokens=6, seed=12, temperature=0.5)
    cut = Sampling(
        max_new_tokens=6, seed=12, temperature=0.5, top_k=2, top_p=0.5, min_p=0.2,
        repetition_penalty=1.5,
    )  # fmt: skip
    assert await plain_row_with(neutral) == await plain_row_with(cut)


async def test_the_local_client_answers_a_row_when_it_stops_not_when_its_batch_ends(
    client: LocalModelClient,
) -> None:
    """An eval's rollouts finish (and its progress bar moves) one by one on the local
    model: a short row of a batch is answered while a long batch mate is still being
    sampled. The trainer's generator answers every row at its batch's end."""
    import threading

    from vfops.local._batched import BatchedGenerator, Sampling

    assert client.generator.resolve_rows_early
    prompt = client._encode([{"role": "user", "content": "x"}], None)

    async def short_row_answered_mid_batch(generator: BatchedGenerator) -> bool:
        generator.eos_ids = []  # no row stops early by chance: only at its cap
        batch_done = threading.Event()
        sample = generator.sample

        def sample_and_mark(batch: Any) -> Any:
            try:
                return sample(batch)
            finally:
                batch_done.set()

        generator.sample_batch = sample_and_mark
        short = asyncio.ensure_future(generator.generate(prompt, Sampling(1, seed=1)))
        long = asyncio.ensure_future(generator.generate(prompt, Sampling(300, seed=2)))
        first = await short
        mid_batch = not batch_done.is_set()
        rest = await long
        assert first.batch_size == rest.batch_size == 2  # they shared one batch
        assert len(first.token_ids) == 1 and len(rest.token_ids) == 300
        await generator.aclose()
        return mid_batch

    early = BatchedGenerator(
        client.model, client.tokenizer, max_batch_size=4, resolve_rows_early=True
    )
    at_batch_end = BatchedGenerator(client.model, client.tokenizer, max_batch_size=4)
    assert await short_row_answered_mid_batch(early)
    assert not await short_row_answered_mid_batch(at_batch_end)


async def test_local_client_rejects_too_long_prompt(client: LocalModelClient) -> None:
    long_text = " ".join(str(i) for i in range(3000))
    with pytest.raises(PromptTooLongError):
        await client.chat(model="tiny", messages=[{"role": "user", "content": long_text}])


async def test_local_client_joins_text_parts_and_refuses_an_image(
    client: LocalModelClient,
) -> None:
    plain = [{"role": "user", "content": "say hi"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "say "},
                                          {"type": "text", "text": "hi"}]}]  # fmt: skip
    args = {"max_tokens": 4, "seed": 3}
    same = [await client.chat(model="tiny", messages=m, sampling_args=args) for m in (plain, parts)]
    assert same[0].message == same[1].message and same[0].prompt_tokens == same[1].prompt_tokens
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    refused = "message 0 has a content part of type 'image_url'"
    with pytest.raises(InvalidArgumentError, match=refused):
        await client.chat(model="tiny", messages=image)


def test_local_client_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(VfopsError, match="build-tiny"):
        LocalModelClient(tmp_path / "nope")


def test_parse_tool_calls() -> None:
    calls = parse_tool_calls(
        'ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        " <tool_call>bad</tool_call>"
    )
    assert len(calls) == 1
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}


def test_cli_build_tiny_is_deterministic(tmp_path: Path, tiny_dir: Path) -> None:
    result = CliRunner().invoke(app, ["build-tiny", str(tmp_path / "m"), "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert str((tmp_path / "m").resolve()) in result.output
    assert "parameters:" in result.output
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "m" / name).read_bytes() == (tiny_dir / name).read_bytes(), name


def test_cli_serve_rejects_non_model_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", str(tmp_path)])
    assert result.exit_code != 0
    assert isinstance(result.exception, VfopsError)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"server not healthy after {timeout_s:.0f}s")


def _start(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(cmd, env=serve_env(), stdout=log, stderr=subprocess.STDOUT)


async def test_transformers_serve_smoke(tiny_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from openai import AsyncOpenAI

    port = free_port()
    cmd = serve_command(tiny_dir, host="127.0.0.1", port=port, device="cpu")
    model_name = cmd[cmd.index("serve") + 1]  # requests must name the served path exactly
    log_path = tmp_path / "serve.log"
    proc = _start(cmd, log_path)
    try:
        started = await asyncio.to_thread(
            _wait_healthy, f"http://127.0.0.1:{port}/health", proc, SERVER_START_TIMEOUT_S
        )
        print(f"transformers serve healthy after {started:.1f}s")
        async with AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60
        ) as oai:
            resp = await oai.chat.completions.create(
                model=model_name,
                messages=[{"role": "user", "content": "What is 1 + 1?"}],
                max_tokens=8,
                temperature=1.0,
            )
        choice = resp.choices[0]
        assert choice.message.role == "assistant"
        assert isinstance(choice.message.content, str)
        assert choice.finish_reason in {"length", "stop"}
        assert resp.usage is not None and 1 <= resp.usage.completion_tokens <= 8
        # the whole path: vfops eval against the real model server
        out = tmp_path / "out"
        vfops_eval = await asyncio.to_thread(
            subprocess.run,
            [
                str(Path(sys.executable).parent / "vfops"),
                "eval",
                "arithmetic",
                "-m",
                model_name,
                "-b",
                f"http://127.0.0.1:{port}/v1",
                "-n",
                "3",
                "-r",
                "2",
                "-t",
                "8",
                "-o",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert vfops_eval.returncode == 0, vfops_eval.stderr
        (results,) = out.glob("evals/*/*/results.jsonl")
        rows = [orjson.loads(line) for line in results.read_bytes().splitlines()]
        assert len(rows) == 6 and all(r["error"] is None for r in rows)
        assert all(r["completion"][-1]["role"] == "assistant" for r in rows)
        assert all(1 <= r["usage"]["completion_tokens"] <= 8 for r in rows)
        # a name the server does not serve: one line naming the one it does, no run
        wrong = await asyncio.to_thread(
            subprocess.run,
            [str(Path(sys.executable).parent / "vfops"), "eval", "arithmetic", "-m", "tiny",
             "-b", f"http://127.0.0.1:{port}/v1", "-n", "2", "-o", str(tmp_path / "wrong")],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert wrong.returncode != 0
        assert wrong.stderr.strip().count("\n") == 0, wrong.stderr
        served = (
            f"model 'tiny' is not served at http://127.0.0.1:{port}/v1; it serves {model_name};"
        )
        assert served in wrong.stderr
        assert not (tmp_path / "wrong").exists()
    except BaseException:
        print(log_path.read_text(errors="replace")[-4000:])
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_eval_against_the_in_process_local_model(tiny_dir: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "vfops"),
            "eval",
            "arithmetic",
            "-m",
            f"local:{tiny_dir}",
            "-n",
            "4",
            "-r",
            "2",
            "-t",
            "8",
            "-o",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "reward" in result.stdout
    (results,) = tmp_path.glob("evals/*/*/results.jsonl")
    rows = [orjson.loads(line) for line in results.read_bytes().splitlines()]
    assert len(rows) == 8 and all(r["error"] is None for r in rows)
    assert all(r["usage"]["completion_tokens"] <= 8 for r in rows)


def test_vfops_model_serve_stops_its_server_on_sigterm(tiny_dir: Path, tmp_path: Path) -> None:
    """A supervisor's SIGTERM to `vfops model serve` stops the server it started too,
    cleanly: every process of it gone (the model's, Python's resource tracker), and its
    output is the server's own lines: no "Loading weights" bar, and no "leaked semaphore
    objects" warning (uvicorn re-raised SIGTERM under Python's default handler, which
    killed the server before multiprocessing unlinked its queues' semaphores)."""
    import signal
    import sys

    import psutil

    pytest.importorskip("fastapi")
    port = free_port()
    cmd = [sys.executable, "-m", "vfops", "model", "serve", str(tiny_dir), "--port", str(port),
           "--engine", "transformers"]  # fmt: skip
    quiet = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")
    env = {k: v for k, v in os.environ.items() if k not in quiet}
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", proc, SERVER_START_TIMEOUT_S)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 3, "the server, its model's process, the resource tracker"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
        output = log_path.read_text(errors="replace")  # complete: its writers are gone
        assert "Loading weights" not in output, output
        assert "leaked semaphore" not in output, output
    finally:
        if proc.poll() is None:
            proc.kill()


def test_build_tiny_prints_only_its_result(tmp_path: Path) -> None:
    # no third-party warnings (DeepSpeed's "no GPU found" among them): two lines, the
    # model's folder and its size
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    result = subprocess.run(
        [sys.executable, "-m", "vfops", "model", "build-tiny", str(tmp_path / "m")],
        capture_output=True, text=True, env=env, check=True, timeout=300,
    )  # fmt: skip
    assert result.stderr.strip() == "", result.stderr
    assert result.stdout.splitlines()[0].endswith("/m")
    assert result.stdout.splitlines()[1].startswith("parameters: ")


async def test_local_client_gives_logprobs_when_asked(client: LocalModelClient) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    args = {"temperature": 1.0, "max_tokens": 6, "seed": 7}
    plain = await client.chat(model="tiny", messages=messages, sampling_args=args)
    asked = await client.chat(
        model="tiny", messages=messages, sampling_args={**args, "logprobs": True}
    )
    assert plain.raw is not None and "logprobs" not in plain.raw
    assert asked.raw is not None and asked.raw["completion_ids"] == plain.raw["completion_ids"]
    content = asked.raw["logprobs"]["content"]
    assert len(content) == asked.completion_tokens
    assert all(item["logprob"] <= 0.0 for item in content)
    # a random model at temperature 1: no token is certain
    assert all(item["logprob"] < 0.0 for item in content)
    assert "".join(item["token"] for item in content).strip() in asked.message["content"] + " "
    with pytest.raises(InvalidArgumentError, match="top_logprobs"):
        await client.chat(model="tiny", messages=messages, sampling_args={"top_logprobs": 3})
    with pytest.raises(InvalidArgumentError, match="send n requests"):
        await client.chat(model="tiny", messages=messages, sampling_args={"n": 2})


def test_vfops_own_server_gives_n_choices_with_logprobs(tiny_dir: Path, tmp_path: Path) -> None:
    """`vfops model serve` (vfops's own engine): ``n`` choices, each with its sampled
    tokens' logprobs, over OpenAI's API; a seeded request answers the same twice; bad
    sampling arguments and unknown models are 4xx in OpenAI's shape; `vfops eval` runs
    against it; SIGTERM stops it with nothing left running."""
    import signal

    import psutil

    port = free_port()
    cmd = [sys.executable, "-m", "vfops", "model", "serve", str(tiny_dir), "--port", str(port)]
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=serve_env(), stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"

    def post(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            f"{base}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", proc, SERVER_START_TIMEOUT_S)
        ask = {"model": tiny_dir.name, "messages": [{"role": "user", "content": "1 + 1?"}],
               "max_tokens": 6, "temperature": 1.0}  # fmt: skip
        status, reply = post({**ask, "n": 3, "logprobs": True})
        assert status == 200, reply
        assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
        tokens = 0
        for choice in reply["choices"]:
            content = choice["logprobs"]["content"]
            assert 1 <= len(content) <= 6 and all(t["logprob"] <= 0.0 for t in content)
            tokens += len(content)
        assert reply["usage"]["completion_tokens"] == tokens
        seeded = [post({**ask, "seed": 7})[1]["choices"][0]["message"] for _ in range(2)]
        assert seeded[0] == seeded[1]
        status, reply = post({**ask, "logprobs": True, "top_logprobs": 2})
        assert status == 400 and "top_logprobs" in reply["error"]["message"]
        status, reply = post({**ask, "model": "gpt-4o"})
        assert status == 404 and tiny_dir.name in reply["error"]["message"]
        # OpenAI's list content: text parts are their concatenation; an image is a 400
        # naming the part (it was a bare 500, retried five times by every client)
        parts = [{"type": "text", "text": "1 + "}, {"type": "text", "text": "1?"}]
        as_parts = {**ask, "messages": [{"role": "user", "content": parts}], "seed": 7}
        assert post(as_parts)[1]["choices"][0]["message"] == seeded[0]
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        status, reply = post({**ask, "messages": [{"role": "user", "content": [image]}]})
        assert status == 400 and "content part of type 'image_url'" in reply["error"]["message"]
        done = subprocess.run(
            [sys.executable, "-m", "vfops", "eval", "arithmetic", "-m", tiny_dir.name,
             "-b", base, "-n", "3", "-r", "2", "-t", "8", "-o", str(tmp_path / "out"),
             "--no-tracking"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "VFOPS_HOME": str(tmp_path / "home")},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (results,) = (tmp_path / "out").glob("evals/*/*/results.jsonl")
        rows = [orjson.loads(line) for line in results.read_bytes().splitlines()]
        assert len(rows) == 6 and all(r["error"] is None for r in rows)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
