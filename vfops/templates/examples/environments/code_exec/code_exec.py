"""code_exec: write a Python function; hidden tests run it in a sandbox container.

Tasks are generated locally from a seeded RNG (twelve kinds: strings, lists, numbers).
The model's reply must hold the function (a fenced ``python`` block, or the whole reply);
:func:`passed_fraction` sends it and the tests to a sandbox, where a small harness runs
each test in a forked child with its own alarm, output thrown away, and prints one JSON
line of verdicts. The model's code never runs on the host, and never in the harness's
own process.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

import vfops
from vfops.sandbox import SandboxLimits, SandboxPool

SYSTEM_PROMPT = (
    "Write the Python function the user asks for. Reply with the complete function in "
    "one ```python code block; no tests, no example calls."
)

PER_TEST_S = 2.0
"""Each hidden test's own time limit, inside the sandbox."""

HARNESS = r"""
import json, os, select, signal, sys, time
spec = json.load(open("tests.json"))
code = open("solution.py").read()
verdicts = []
for args, expected in spec["tests"]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the model's code, its output thrown away
        os.setpgid(0, 0)  # its own group: whatever it starts is killed with it
        os.close(read)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1); os.dup2(null, 2)
        signal.alarm(int(spec["per_test_s"]) + 1)
        try:
            scope = {"__name__": "solution"}
            exec(compile(code, "solution.py", "exec"), scope)
            got = scope[spec["function"]](*args)
            ok = json.loads(json.dumps(got)) == expected
        except BaseException:
            ok = False
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], spec["per_test_s"])
    answer = os.read(read, 1) if ready else b""
    os.close(read)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(pid, 0)
    verdicts.append(answer == b"1")
print("VERDICTS " + json.dumps(verdicts))
"""


# --- the tasks --------------------------------------------------------------------------
def _words(rng: random.Random) -> str:
    return " ".join(
        "".join(rng.choice("abcdeilmnorstu") for _ in range(rng.randint(1, 7)))
        for _ in range(rng.randint(0, 6))
    )


def _ints(rng: random.Random, n: int = 8) -> list[int]:
    return [rng.randint(-50, 50) for _ in range(rng.randint(0, n))]


def _rle(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(f"{j - i}{text[i]}")
        i = j
    return "".join(out)


def _balanced(text: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def _max_subarray(values: list[int]) -> int:
    best = current = 0
    for value in values:
        current = max(0, current + value)
        best = max(best, current)
    return best


Kind = tuple[str, str, Callable[[random.Random], list[Any]], Callable[..., Any]]
KINDS: tuple[Kind, ...] = (
    ("reverse_words", "reverse_words(s: str) -> str: the words of s (split on single spaces) "
     "in reverse order, joined by single spaces",
     lambda r: [_words(r)], lambda s: " ".join(reversed(s.split(" ")))),
    ("count_vowels", "count_vowels(s: str) -> int: how many of s's characters are vowels "
     "(a, e, i, o, u; lower case only)",
     lambda r: [_words(r)], lambda s: sum(ch in "aeiou" for ch in s)),
    ("sum_even", "sum_even(xs: list[int]) -> int: the sum of the even numbers in xs",
     lambda r: [_ints(r)], lambda xs: sum(x for x in xs if x % 2 == 0)),
    ("second_largest", "second_largest(xs: list[int]) -> int | None: the second largest "
     "distinct value in xs, or None when there are fewer than two distinct values",
     lambda r: [_ints(r)],
     lambda xs: sorted(set(xs))[-2] if len(set(xs)) >= 2 else None),
    ("run_length", "run_length(s: str) -> str: s run-length encoded as count then "
     "character for each run, e.g. 'aaab' -> '3a1b'",
     lambda r: ["".join(r.choice("ab") * r.randint(1, 3) for _ in range(r.randint(0, 5)))],
     _rle),
    ("gcd", "gcd(a: int, b: int) -> int: the greatest common divisor of two non-negative "
     "integers (gcd(0, 0) is 0)",
     lambda r: [r.randint(0, 200), r.randint(0, 200)],
     lambda a, b: __import__("math").gcd(a, b)),
    ("is_palindrome", "is_palindrome(s: str) -> bool: whether s reads the same backwards, "
     "ignoring spaces",
     lambda r: [r.choice([_words(r), "ab ba", "a b a", "abc"])],
     lambda s: s.replace(" ", "") == s.replace(" ", "")[::-1]),
    ("balanced", "balanced(s: str) -> bool: whether the brackets ()[]{} in s are balanced "
     "and properly nested (other characters are ignored)",
     lambda r: ["".join(r.choice("()[]{}x") for _ in range(r.randint(0, 8)))], _balanced),
    ("max_subarray", "max_subarray(xs: list[int]) -> int: the largest sum of a contiguous "
     "run of xs; the empty run counts (so the result is never negative)",
     lambda r: [_ints(r)], _max_subarray),
    ("digits_sum", "digits_sum(n: int) -> int: the sum of the decimal digits of |n|",
     lambda r: [r.randint(-10**6, 10**6)], lambda n: sum(int(d) for d in str(abs(n)))),
    ("dedupe", "dedupe(xs: list[int]) -> list[int]: xs without repeated values, keeping "
     "each value's first occurrence in order",
     lambda r: [[r.randint(0, 5) for _ in range(r.randint(0, 9))]],
     lambda xs: list(dict.fromkeys(xs))),
    ("fizzbuzz", "fizzbuzz(n: int) -> str: 'FizzBuzz' if n is divisible by 15, 'Fizz' by "
     "3, 'Buzz' by 5, else str(n)",
     lambda r: [r.randint(1, 100)],
     lambda n: "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0
     else "Buzz" if n % 5 == 0 else str(n)),
)  # fmt: skip


def build_dataset(
    num_examples: int, *, seed: int = 0, split: str = "eval", tests_per_task: int = 6
) -> list[dict[str, Any]]:
    """Tasks with hidden tests (``info``); the answer names the function."""
    rng = random.Random(f"code_exec:{split}:{seed}")
    rows: list[dict[str, Any]] = []
    for index in range(num_examples):
        name, spec, make_args, reference = KINDS[index % len(KINDS)]
        tests = []
        for _ in range(tests_per_task):
            args = make_args(rng)
            tests.append([args, json.loads(json.dumps(reference(*args)))])
        rows.append(
            {
                "question": f"Write a Python function {spec}.",
                "answer": name,
                "info": {"function": name, "tests": tests},
            }
        )
    return rows


# --- the reward ------------------------------------------------------------------------
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_code(completion: list[dict[str, Any]]) -> str:
    """The last fenced code block of the last reply, or the whole reply."""
    text = next(
        (str(m.get("content") or "") for m in reversed(completion) if m["role"] == "assistant"),
        "",
    )
    blocks = _BLOCK.findall(text)
    return blocks[-1] if blocks else text


def make_reward(pool: Callable[[], SandboxPool], per_test_s: float) -> Callable[..., Any]:
    async def passed_fraction(
        completion: list[dict[str, Any]], info: dict[str, Any], state: dict[str, Any]
    ) -> float:
        """The fraction of hidden tests the function passes, run in a sandbox."""
        code = extract_code(completion)
        tests = info["tests"]
        spec = {"function": info["function"], "tests": tests, "per_test_s": per_test_s}
        async with pool().sandbox() as box:
            result = await box.run(
                ["python3", "harness.py"],
                files={"harness.py": HARNESS, "solution.py": code, "tests.json": json.dumps(spec)},
                wall_s=per_test_s * len(tests) + 10,
            )
        line = next(
            (x for x in reversed(result.stdout.splitlines()) if x.startswith("VERDICTS ")), None
        )
        if line is None:
            # the harness did not finish: the sandbox's own limit, never the model's score
            raise RuntimeError(
                f"code_exec's test harness did not report ({result.describe()}): "
                f"{result.stderr.strip()[-300:]}"
            )
        verdicts = json.loads(line.removeprefix("VERDICTS "))
        return sum(verdicts) / len(verdicts) if verdicts else 0.0

    return passed_fraction


def _pool_per_loop(size: int, limits: SandboxLimits) -> Callable[[], SandboxPool]:
    pools: dict[Any, SandboxPool] = {}

    def pool() -> SandboxPool:
        # one pool per event loop (asyncio objects belong to theirs)
        import asyncio

        loop = asyncio.get_running_loop()
        if loop not in pools:
            pools[loop] = SandboxPool(size, limits=limits)
            pools[loop].fill()
        return pools[loop]

    return pool


def _datasets(
    num_eval: int, num_train: int, tests_per_task: int, seed: int
) -> dict[str, list[dict[str, Any]]]:
    return {
        "dataset": build_dataset(num_train, seed=seed, split="train",
                                 tests_per_task=tests_per_task),
        "eval_dataset": build_dataset(num_eval, seed=seed, split="eval",
                                      tests_per_task=tests_per_task),
    }  # fmt: skip


TOOLS_PROMPT = (
    "Write the Python function the user asks for. You may run code first with the python "
    "and bash tools (a sandbox: no network). When you are done, reply with the complete "
    "function in one ```python code block and no tool call."
)


def load_environment(
    num_eval_examples: int = 24,
    num_train_examples: int = 240,
    tests_per_task: int = 6,
    per_test_s: float = PER_TEST_S,
    tools: bool = False,
    max_turns: int = 6,
    pool_size: int = 2,
    memory_mb: int = 512,
    seed: int = 0,
) -> vfops.Environment:
    """Python functions graded by hidden tests in a sandbox (partial credit per test).

    With ``tools``, the model may first run code with ``python`` and ``bash`` tools in
    the rollout's own sandbox (files persist across its turns, at most ``max_turns``);
    it is graded the same way."""
    limits = SandboxLimits(memory_mb=memory_mb, wall_s=per_test_s * tests_per_task + 10)
    reward = make_reward(_pool_per_loop(pool_size, limits), per_test_s)
    data = _datasets(num_eval_examples, num_train_examples, tests_per_task, seed)
    if not tools:
        return vfops.SingleTurnEnv(
            **data, system_prompt=SYSTEM_PROMPT, rubric=vfops.Rubric([reward])
        )
    return vfops.SandboxToolEnv(
        **data,
        system_prompt=TOOLS_PROMPT,
        rubric=vfops.Rubric([reward]),
        limits=SandboxLimits(memory_mb=memory_mb, wall_s=10),
        pool_size=pool_size,
        max_turns=max_turns,
    )


__all__ = [
    "HARNESS",
    "KINDS",
    "build_dataset",
    "extract_code",
    "load_environment",
]
