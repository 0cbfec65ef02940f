"""``vfops eval code_exec`` against an endpoint on loopback whose replies are correct,
wrong, partly right and hostile code: the rewards are what the hidden tests imply, every
attack is contained in the sandbox, the API key in the eval's environment reaches no
container, a harness the code killed is the rollout's error (never a score), and after a
``kill -9`` of the eval the next vfops command leaves none of its containers.

Each hostile function returns the right answer only if its attack worked: a reward of
0.0 says the attack failed, and so that the sandbox held.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox_fixtures import base_image, containers
from tests.test_bad_input import vfops
from vfops.evaluation import iter_records
from vfops.sandbox import OWNER_LABEL, RUN_LABEL, owner_id
from vfops.testing import StubConfig, StubServer

__all__ = ["base_image"]

SECRET = "sk-eval-key-that-must-stay-on-the-host-5678"

CODE = {
    # right
    "reverse_words": "def reverse_words(s):\n    return ' '.join(reversed(s.split(' ')))",
    "fizzbuzz": (
        "def fizzbuzz(n):\n    return 'FizzBuzz' if n % 15 == 0 else 'Fizz' if n % 3 == 0"
        " else 'Buzz' if n % 5 == 0 else str(n)"
    ),
    # wrong: every test fails
    "gcd": "def gcd(a, b):\n    return -1",
    # partly right: negative numbers raise (the test computes the expected fraction)
    "digits_sum": "def digits_sum(n):\n    return sum(int(d) for d in str(n))",
    # hostile: each returns the right answer only if its attack worked
    "count_vowels": (
        "import socket\n"
        "def count_vowels(s):\n"
        "    socket.create_connection(('127.0.0.1', 5432), timeout=1).close()\n"
        "    return sum(ch in 'aeiou' for ch in s)"
    ),
    "sum_even": (
        "import os\n"
        f"def sum_even(xs):\n"
        f"    seen = str(dict(os.environ)) + open('/proc/1/environ').read()\n"
        f"    assert 'OPENAI_API_KEY' in seen or {SECRET!r} in seen\n"
        "    return sum(x for x in xs if x % 2 == 0)"
    ),
    "run_length": (
        "def run_length(s):\n"
        "    open('/etc/pwned', 'w').write('x')\n"
        "    out, i = [], 0\n"
        "    while i < len(s):\n"
        "        j = i\n"
        "        while j < len(s) and s[j] == s[i]: j += 1\n"
        "        out.append(f'{j - i}{s[i]}'); i = j\n"
        "    return ''.join(out)"
    ),
    "is_palindrome": ("import os\ndef is_palindrome(s):\n    while True:\n        os.fork()"),
    "balanced": "def balanced(s):\n    x = bytearray(2 * 1024 ** 3)\n    return True",
    "max_subarray": (
        "def max_subarray(xs):\n"
        "    with open('fill', 'wb') as f:\n"
        "        while True: f.write(b'0' * 1048576)"
    ),
    # prints 16 MiB a call, then answers right: the harness throws the output away, so
    # the honest reward is the tests' (1.0), and the run is unharmed (a gigabyte printed
    # straight to the sandbox's output is tests/test_sandbox.py's)
    "second_largest": (
        "import sys\n"
        "def second_largest(xs):\n"
        "    for _ in range(16): sys.stdout.write('x' * 1048576)\n"
        "    return sorted(set(xs))[-2] if len(set(xs)) > 1 else None"
    ),
    "dedupe": "def dedupe(xs):\n    while True: pass",
}
EXPECTED = {
    "reverse_words": 1.0, "fizzbuzz": 1.0, "gcd": 0.0,
    "count_vowels": 0.0, "sum_even": 0.0, "run_length": 0.0, "is_palindrome": 0.0,
    "balanced": 0.0, "max_subarray": 0.0, "second_largest": 1.0, "dedupe": 0.0,
}  # fmt: skip
KILLER = "import os, signal\ndef gcd(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)"


def function_of(request: dict[str, Any]) -> str:
    question = next(m["content"] for m in request["messages"] if m["role"] == "user")
    match = re.search(r"function (\w+)\(", question)
    assert match, question
    return match.group(1)


def reply(request: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": f"```python\n{CODE[function_of(request)]}\n```"}


def killer_reply(request: dict[str, Any]) -> dict[str, Any]:
    name = function_of(request)
    code = KILLER if name == "gcd" else CODE["dedupe"].replace("dedupe", name)
    return {"role": "assistant", "content": f"```python\n{code}\n```"}


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode=reply)) as server:
        yield server


def records(out: Path) -> dict[str, Any]:
    (run_dir,) = {path.parent for path in out.glob("evals/*/*/results.jsonl")}
    return {record.info["function"]: record for record in iter_records(run_dir)}


def test_rewards_are_the_hidden_tests_and_every_attack_is_contained(
    tmp_path: Path, stub: StubServer, base_image: str
) -> None:
    extra = {"OPENAI_API_KEY": SECRET, "VFOPS_SANDBOX_IMAGE": base_image}
    # 5 s a test: a right answer is never cut short on a loaded machine (the hostile
    # ones that run on are cut at it)
    args = ["eval", "code_exec", "-m", "stub-model", "-b", stub.base_url, "-n", "12",
            "-r", "1", "-c", "12", "-a", '{"per_test_s": 5.0}', "-o", str(tmp_path / "out"),
            "-q"]  # fmt: skip
    proc = vfops(args, tmp_path, extra)
    assert proc.returncode == 0, proc.stderr
    found = records(tmp_path / "out")
    assert sorted(found) == sorted(CODE)
    rewards = {name: record.reward for name, record in found.items()}
    partial = found["digits_sum"]
    expected = {**EXPECTED, "digits_sum": _buggy_digits_sum(partial.info["tests"])}
    assert rewards == expected
    assert 0.0 < expected["digits_sum"] < 1.0  # the partial credit is partial
    assert all(record.error is None for record in found.values())
    assert SECRET not in proc.stdout + proc.stderr
    assert not Path("/etc/pwned").exists()
    (metadata,) = (tmp_path / "out").glob("evals/*/*/metadata.json")
    run = json.loads(metadata.read_text())["run_id"]
    assert containers(RUN_LABEL, run) == []  # the warm pool's went too, before the exit


def _buggy_digits_sum(tests: list[Any]) -> float:
    # the buggy function's outcome, on the host (the test's own code): negatives raise
    return sum(args[0] >= 0 for args, _ in tests) / len(tests)


def test_code_that_kills_the_harness_is_an_error_not_a_score(
    tmp_path: Path, base_image: str
) -> None:
    with StubServer(StubConfig(reply_mode=killer_reply)) as server:
        args = ["eval", "code_exec", "-m", "stub-model", "-b", server.base_url, "-n", "6",
                "-r", "1", "-a", '{"tests_per_task": 2, "per_test_s": 1.0}',
                "-o", str(tmp_path / "out"), "-q"]  # fmt: skip
        proc = vfops(args, tmp_path, {"VFOPS_SANDBOX_IMAGE": base_image})
    found = records(tmp_path / "out")
    killed = found["gcd"]
    assert killed.reward is None and killed.error is not None
    assert "harness did not report" in killed.error.message
    others = [record for name, record in found.items() if name != "gcd"]
    assert len(others) == 5 and all(record.reward == 0.0 for record in others)
    assert proc.returncode != 0 or "1 error" in proc.stdout + proc.stderr


def test_after_kill_9_of_an_eval_the_next_command_leaves_none_of_its_containers(
    tmp_path: Path, base_image: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with StubServer(StubConfig(reply_mode=killer_reply)) as server:
        eval_proc, owner = _scoring_in_containers(server, tmp_path, base_image)
        eval_proc.send_signal(signal.SIGKILL)
        eval_proc.wait()
    assert len(containers(OWNER_LABEL, owner)) >= 3  # nothing removed them yet
    after = subprocess.run(
        [sys.executable, "-m", "vfops", "runs", "list"],
        env=_env(home, base_image), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert after.returncode == 0, after.stderr
    assert containers(OWNER_LABEL, owner) == []


def _scoring_in_containers(
    server: StubServer, tmp_path: Path, image: str
) -> tuple[subprocess.Popen[bytes], str]:
    """``vfops eval code_exec`` (every answer runs until its tests' time limits) in the
    background, once at least 3 of its containers are running; it and its owner id."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    eval_proc = subprocess.Popen(
        [sys.executable, "-m", "vfops", "eval", "code_exec", "-m", "stub-model",
         "-b", server.base_url, "-n", "8", "-r", "1", "-c", "8",
         "-a", '{"per_test_s": 5.0}', "-o", str(tmp_path / "out"), "-q"],
        env=_env(home, image), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    owner = owner_id(eval_proc.pid)
    # the state we wait for: the eval's rollouts are scoring in running containers
    deadline = time.monotonic() + 90
    while len(containers(OWNER_LABEL, owner)) < 3:
        assert eval_proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    return eval_proc, owner


def _env(home: Path, image: str) -> dict[str, str]:
    import os

    env = {key: value for key, value in os.environ.items() if key != "VFOPS_DATABASE_URL"}
    return {**env, "VFOPS_HOME": str(home), "VFOPS_TRACKING": "0",
            "VFOPS_SANDBOX_IMAGE": image}  # fmt: skip


def tool_reply(request: dict[str, Any]) -> dict[str, Any]:
    """A shell command, then Python reading the file it wrote, then the answer."""
    results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
    calls = [
        ("bash", {"command": 'echo persisted > note.txt && printf %s "$OPENAI_API_KEY" | wc -c'}),
        ("python", {"code": "print(open('note.txt').read().strip())"}),
    ]
    if len(results) < len(calls):
        name, arguments = calls[len(results)]
        call = {"id": f"call_{len(results)}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return reply(request)


def test_tools_run_in_the_rollouts_own_sandbox_across_turns(
    tmp_path: Path, base_image: str
) -> None:
    with StubServer(StubConfig(reply_mode=tool_reply)) as server:
        args = ["eval", "code_exec", "-m", "stub-model", "-b", server.base_url, "-n", "2",
                "-r", "2", "-a", '{"tools": true}', "-o", str(tmp_path / "out"), "-q"]  # fmt: skip
        extra = {"OPENAI_API_KEY": SECRET, "VFOPS_SANDBOX_IMAGE": base_image}
        proc = vfops(args, tmp_path, extra)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = {path.parent for path in (tmp_path / "out").glob("evals/*/*/results.jsonl")}
    found = list(iter_records(run_dir))
    assert len(found) == 4
    for record in found:
        said = [m["content"] for m in record.completion if m["role"] == "tool"]
        assert said == ["0\n", "persisted\n"]  # no key inside; the file kept between turns
        assert record.reward == EXPECTED[record.info["function"]] and record.error is None
        assert record.metrics["tool_calls"] == 2 and record.metrics["tool_errors"] == 0
    metadata = json.loads((run_dir / "metadata.json").read_text())
    (used,) = metadata["sandboxes"]
    assert used["engine"] == "podman" and used["image"] == base_image
    assert used["image_digest"].startswith("sha256:") and used["limits"]["network"] is False


def test_a_missing_image_is_each_rollouts_error_never_a_tool_output(tmp_path: Path) -> None:
    with StubServer(StubConfig(reply_mode=tool_reply)) as server:
        args = ["eval", "code_exec", "-m", "stub-model", "-b", server.base_url, "-n", "2",
                "-r", "1", "-a", '{"tools": true}', "-o", str(tmp_path / "out"), "-q"]  # fmt: skip
        proc = vfops(args, tmp_path, {"VFOPS_SANDBOX_IMAGE": "localhost/vfops-missing:1"})
    assert proc.returncode != 0
    found = records(tmp_path / "out")
    for record in found.values():
        assert record.reward is None and record.error is not None
        assert "is not on this host" in record.error.message
        assert not [m for m in record.completion if m["role"] == "tool"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_eval_removes_its_containers_before_it_exits(
    tmp_path: Path, base_image: str, signum: int
) -> None:
    with StubServer(StubConfig(reply_mode=killer_reply)) as server:
        eval_proc, owner = _scoring_in_containers(server, tmp_path, base_image)
        eval_proc.send_signal(signum)
        assert eval_proc.wait(timeout=120) != 0  # interrupted: not a result
    assert containers(OWNER_LABEL, owner) == []  # gone before it exited
