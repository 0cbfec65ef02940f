"""``vfops eval`` against verifiers' own ``vf-eval`` on installed verifiers v1 tasksets: both
evals of each taskset on one scripted endpoint, timed from start to exit, and compared per
task (rewards, per-function metrics, stop conditions and turn counts, as multisets).

Run it with a Python that has vfops (it starts the scripted endpoint in-process); the two
evals run from ``--venv``, a virtualenv with vfops, verifiers 0.4 and the tasksets::

    .venv/bin/python bench/v1_conformance.py --venv .venv-v1 v1_arith glossary
    .venv/bin/python bench/v1_conformance.py --venv VENV -n 4 -r 2 --data DIR \\
        reverse_text 'reverse_text:{"task": {"judges": [{"id": "reference",
        "base_url": "$STUB", "api_key_var": "STUB_KEY", "model": "stub-model"}]}}'

A taskset is ``NAME`` or ``NAME:JSON``, JSON being its arguments as vfops's ``-a`` takes
them (``TasksetConfig`` fields, ``"task"`` for its ``TaskConfig``); ``vf-eval`` gets the
same under ``env.taskset`` in a config file (``@ FILE``). The string ``$STUB`` in them
becomes the endpoint's base URL (a judge on the endpoint); ``STUB_KEY`` holds its key.

The endpoint's replies depend only on the messages (text, images, tool calls; never ids
or time): right and wrong answers (about one in four wrong, by a hash of the messages),
a tool call while tools are offered and none was made since the user spoke, the tool's
result as the answer after one, judge verdicts, a move among the bracketed options of a
game, a JSON object when one is asked for, sorted lists, reversed text, small programs.

``vf-eval`` runs every agent role of the taskset's Env on its tool-less chat harness
(``null``) on the subprocess runtime, in its in-process runner (no dashboard, no
upload): what vfops's in-process harness stands in for. ``vfops eval`` runs with its
defaults (registry and MLflow tracking) in a home of its own. Both run in ``--data``
(default: a scratch folder), so a hub dataset id ``org/name`` that exists as a folder
there loads from it (``datasets`` tries a local path first); ``HF_HUB_OFFLINE`` and
``HF_DATASETS_OFFLINE`` are set unless ``--online``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfops.testing import StubConfig, StubServer
from vfops.testing._stub_server import arithmetic_reply, echo_answer_reply

MODEL = "stub-model"
KEY_VAR = "STUB_KEY"
STUB_PLACEHOLDER = "$STUB"
WRONG_SHARE = 4
"""One reply in this many (by a hash of the messages) is a wrong answer."""
STRIP_ENV = (
    "MLFLOW_TRACKING_URI", "VFOPS_DATABASE_URL", "VFOPS_TRACKING", "VFOPS_ARTIFACTS",
    "VFOPS_MLFLOW_ARTIFACTS", "VFOPS_TRACE_ROLLOUTS", "PRIME_API_KEY",
)  # fmt: skip
"""Settings a user's shell may carry that would send either eval elsewhere."""


# --- the scripted endpoint: a reply from the messages only ---------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )  # fmt: skip
    return ""


def _images(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    found = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            source = part.get("image_url")
            found.append(str(source.get("url", "")) if isinstance(source, dict) else str(source))
    return found


def _calls(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, arguments) of a message's tool calls, arguments re-encoded canonically."""
    found = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.dumps(json.loads(raw), sort_keys=True)
        except (TypeError, ValueError):
            arguments = str(raw)
        found.append((str(function.get("name", "")), arguments))
    return found


def _digest(messages: list[dict[str, Any]]) -> int:
    """A hash of what the messages say (roles, text, images, tool calls), not of ids or
    field layout, which the two evals' chat loops may write differently."""
    canon = [
        (m.get("role"), _text(m.get("content")), _images(m.get("content")), _calls(m))
        for m in messages
    ]
    blob = json.dumps(canon, sort_keys=True).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big")


_QUOTED = re.compile(r'"([^"\n]{1,200})"')
_TICKED = re.compile(r"`([^`\n]{1,300})`")
_TAG = re.compile(r"<([A-Za-z_][\w-]*)>")
_BRACKETED = re.compile(r"\[([A-Za-z][\w-]{0,30})\]")
_INTEGER = re.compile(r"-?\d+")


def _solve(text: str) -> str:
    """A small solver of the text's last paragraph with a number in it, else its last
    (the question: instructions and their examples come first, a closing line may follow):
    a sum over a range, ``a op b``, a word reversed, else the sum of the integers in it
    (right for some word problems, wrong for others)."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()] or [""]
    text = next((p for p in reversed(paragraphs) if _INTEGER.search(p)), paragraphs[-1])
    ranged = re.search(
        r"sum of (?:all )?(?:the )?(?:integers|numbers) (?:from )?(-?\d+) to (-?\d+)",
        text,
        re.IGNORECASE,
    )
    if ranged:
        low, high = int(ranged.group(1)), int(ranged.group(2))
        return str(sum(range(low, high + 1)))
    if re.search(r"-?\d+(?:\.\d+)?\s*[-+*/x×÷]\s*-?\d+", text):
        found = re.search(r"<answer>(.*)</answer>", arithmetic_reply(text))
        if found and found.group(1) not in ("unknown", "undefined"):
            return found.group(1)
    word = re.search(r"(?:string|word)\s+\"?(\w+)\"?\s+reversed", text, re.IGNORECASE)
    if word:
        return word.group(1)[::-1]
    return str(sum(int(n) for n in _INTEGER.findall(text)))


def _wrap(answer: str, context: str) -> str:
    """The answer inside the first tag the instructions name (``<answer>``), if any."""
    tag = _TAG.search(context)
    return f"<{tag.group(1)}>{answer}</{tag.group(1)}>" if tag else answer


def _judge(text: str) -> str | None:
    """A verdict when ``text`` is a grading request, else None."""
    conditional = re.search(r"Reply (\w+) if [^.;]*?contains (\S+?);? otherwise (\w+)", text)
    if conditional:
        yes, token, no = conditional.groups()
        candidate = text.split("Candidate:")[-1]
        return yes if token in candidate else no
    labels = re.search(r'Respond either "([^"]+)" or "([^"]+)"', text)
    if labels:
        blocks = re.findall(r"([^\n]*):\s*\n```\n(.*?)\n```", text, re.DOTALL)
        named = {title.strip().lower(): body for title, body in blocks}
        reference = next((b for t, b in named.items() if "answer" in t), "")
        response = next((b for t, b in named.items() if t.startswith("response")), "")
        right = bool(reference.strip()) and reference.strip().lower() in response.lower()
        return labels.group(1) if right else labels.group(2)
    criteria = re.findall(r"^- ([^:\n]+): .*\(answer one of, worst to best: ([^)]*)\)", text, re.M)
    if criteria and '"verdicts"' in text:
        response = text.split("Response:")[-1]
        verdicts = []
        for name, options in criteria:
            choices = [c.strip() for c in options.split(",")]
            pick = choices[-1] if _digest([{"content": name + response}]) % 2 else choices[0]
            verdicts.append({"name": name, "reason": "scripted", "verdict": pick})
        return json.dumps({"verdicts": verdicts})
    return None


def _tool_call(tools: list[dict[str, Any]], said: str, digest: int, wrong: bool) -> dict[str, Any]:
    """A call of the tool the text names (else the first), each required argument taken
    from the text (``name="v"``, a `ticked` or "quoted" span); a wrong call passes the
    text arguments reversed (so a wrong answer comes from the tool itself)."""
    names = [str((t.get("function") or {}).get("name", "")) for t in tools]
    chosen = next((i for i, n in enumerate(names) if n and n in said), 0)
    function = tools[chosen].get("function") or {}
    schema = function.get("parameters") or {}
    properties: dict[str, Any] = schema.get("properties") or {}
    wanted = schema.get("required") or list(properties)
    ticked = [t for t in _TICKED.findall(said) if t not in names]
    quoted = _QUOTED.findall(said)
    arguments: dict[str, Any] = {}
    for prop in wanted:
        kind = (properties.get(prop) or {}).get("type", "string")
        named = re.search(rf"\b{re.escape(prop)}\s*[=:]\s*[\"']?([^\"'\s,]+)", said)
        if kind in ("integer", "number"):
            number = named.group(1) if named else next(iter(_INTEGER.findall(said)), "0")
            arguments[prop] = int(number) if number.lstrip("-").isdigit() else 0
        elif kind == "boolean":
            arguments[prop] = True
        else:
            value = named.group(1) if named else (ticked or quoted or [said.strip()])[0]
            arguments[prop] = value[::-1] if wrong else value
    return {
        "id": f"call_{digest:016x}",
        "type": "function",
        "function": {"name": names[chosen], "arguments": json.dumps(arguments)},
    }


def _json_contract(said: str, digest: int) -> str | None:
    """A JSON object filled in when the text shows one to end with (``{"k": <integer>}``):
    a question of arithmetic in its string fields, the question's answer in its numbers."""
    template = re.search(r"\{[^{}]*\"\w+\"\s*:[^{}]*\}", said)
    if template is None:
        return None
    pairs = re.findall(r'"(\w+)"\s*:\s*("?<[^>]*>"?|[^,}]+)', template.group(0))
    if not pairs:
        return None
    a, b = 10 + digest % 90, 2 + (digest >> 8) % 9
    op, value = (("+", a + b), ("-", a - b), ("*", a * b))[(digest >> 16) % 3]
    question = f"What is {a} {op} {b}?"
    filled: dict[str, Any] = {}
    for key, placeholder in pairs:
        numeric = any(w in placeholder.lower() for w in ("integer", "number", "int>"))
        filled[key] = value if numeric or not placeholder.startswith('"') else question
    return "Here it is.\n" + json.dumps(filled)


def _answer(messages: list[dict[str, Any]], wrong: bool, digest: int) -> str:
    said = _text(messages[-1].get("content")) if messages else ""
    context = "\n".join(
        _text(m.get("content")) for m in messages if m.get("role") in ("system", "user")
    )
    images = [url for m in messages for url in _images(m.get("content"))]
    if images:  # letters read off each image so far (a letter per distinct picture)
        letters = "".join("ABCDEFGHI"[_digest([{"content": url}]) % 9] for url in images)
        return letters[::-1] if wrong else letters
    options = list(dict.fromkeys(_BRACKETED.findall(said)))
    if len(options) >= 2:  # a game: one of the bracketed moves, now and then none
        return "I pass." if wrong else f"I choose [{options[digest % len(options)]}]."
    contract = _json_contract(said, digest)
    if contract is not None:
        return contract
    exact = re.search(r"Reply with exactly (\S+?)\.?$", said.strip())
    if exact:
        return exact.group(1)
    listed = re.search(r"\bsort\b[^:\n]*:\s*([^\n]+)", said, re.IGNORECASE)
    if listed:
        items = sorted(x.strip() for x in listed.group(1).split(",") if x.strip())
        tag = _TAG.search(said) or next(
            (t for m in reversed(messages) if (t := _TAG.search(_text(m.get("content"))))), None
        )
        body = "\n".join(items[::-1] if wrong else items)
        return f"<{tag.group(1)}>\n{body}\n</{tag.group(1)}>" if tag else body
    if re.search(r"\bpython\b", context, re.IGNORECASE) and "program" in context.lower():
        value = _solve(said)
        shown = value if value.lstrip("-").isdigit() else repr(value)
        return f"```python\nprint({shown}{' + 1' if wrong and shown.isdigit() else ''})\n```"
    if "revers" in context.lower():
        quoted = _QUOTED.findall(said)
        source = quoted[0] if quoted else said
        flipped = source[::-1]
        return _wrap(flipped[: len(flipped) // 2] if wrong else flipped, context)
    if "####" in context:
        value = _solve(said)
        return f"Adding it up.\n#### {int(value) + 1 if wrong else value}"
    if re.search(r"final (?:integer|number|answer)", said, re.IGNORECASE):
        value = _solve(said)
        return str(int(value) + 1) if wrong and value.lstrip("-").isdigit() else value
    return echo_answer_reply(said)


def scripted_reply(request: dict[str, Any]) -> dict[str, Any]:
    """The endpoint's assistant message for a chat request, from its messages only."""
    messages: list[dict[str, Any]] = list(request.get("messages") or [])
    digest = _digest(messages)
    wrong = (digest >> 40) % WRONG_SHARE == 0  # bits apart from those choosing moves
    last = messages[-1] if messages else {}
    verdict = _judge(_text(last.get("content")))
    if verdict is not None:
        return {"role": "assistant", "content": verdict}
    since_user = []
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        since_user.append(message)
    context = "\n".join(
        _text(m.get("content")) for m in messages if m.get("role") in ("system", "user")
    )
    if last.get("role") == "tool":  # the tool answered: its result, verbatim, is the answer
        result = _text(last.get("content")).strip()
        return {"role": "assistant", "content": _wrap(result, context)}
    tools = request.get("tools") or []
    if tools and not any(m.get("tool_calls") for m in since_user):
        users = [m for m in messages if m.get("role") == "user"]
        said = (_text(users[-1].get("content")) if users else "") or context
        call = _tool_call(tools, said, digest, wrong)
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": _answer(messages, wrong, digest)}


# --- running the two evals ------------------------------------------------------------------


@dataclass
class Row:
    """One trace (vf-eval) or one recorded rollout (vfops eval)."""

    task: int
    agent: str
    reward: float | None
    metrics: dict[str, float]
    stop: str
    turns: int
    error: str = ""


@dataclass
class Side:
    label: str
    rc: int | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    rows: list[Row] = field(default_factory=list)
    note: str = ""


@dataclass
class Outcome:
    spec: str
    why_not: str = ""
    vf: Side = field(default_factory=lambda: Side("vf-eval"))
    ours: Side = field(default_factory=lambda: Side("vfops"))
    verdicts: dict[str, str] = field(default_factory=dict)
    first_difference: str = ""
    recorded: str = "-"
    """Whether ``vfops runs show RUN --rollout 0`` shows vfops's run (after the timing)."""


def run_timed(argv: list[str], env: dict[str, str], cwd: Path, log: Path,
              timeout_s: float) -> tuple[int, float, float]:  # fmt: skip
    """Exit status, wall seconds and CPU seconds (user + system of the process and every
    child it reaped) of one command, start to exit; killed (its process group) at the
    time limit."""
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        deadline = started + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                os.killpg(proc.pid, 9)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    return proc.returncode, wall, usage.ru_utime + usage.ru_stime


_PROBE = r"""
import json, sys
spec = json.loads(sys.argv[1])
try:
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import agent_config_fields
    config = vf.resolve_env_config({"taskset": {**spec["args"], "id": spec["name"]}})
    print(json.dumps({"roles": sorted(agent_config_fields(config))}))
except Exception as exc:
    line = (str(exc).strip().splitlines() or [""])[0]
    print(json.dumps({"error": f"{type(exc).__name__}: {line}"[:300]}))
"""


def probe(python: Path, name: str, args: dict[str, Any], env: dict[str, str],
          cwd: Path) -> dict[str, Any]:  # fmt: skip
    """The taskset's agent roles, or why its config does not resolve (not timed)."""
    done = subprocess.run(
        [str(python), "-c", _PROBE, json.dumps({"name": name, "args": args})],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:300]}
    found: dict[str, Any] = json.loads(lines[-1])
    return found


def vf_rows(out: Path) -> list[Row]:
    rows = []
    for path in sorted(out.rglob("traces.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            episode = json.loads(line)
            task = int(episode["task"]["data"]["idx"])
            for trace in episode.get("traces") or []:
                rewards = {k: v for k, v in (trace.get("rewards") or {}).items() if v}
                metrics = {k: float(v["score"]) for k, v in rewards.items()}
                metrics.update(
                    (k, float(v)) for k, v in (trace.get("metrics") or {}).items()
                    if isinstance(v, (int, float))
                )  # fmt: skip
                errors = trace.get("errors") or []
                ok = bool(trace.get("ok", True))
                rows.append(Row(
                    task=task,
                    agent=str((trace.get("agent") or {}).get("name", "")),
                    reward=sum(v["score"] * v.get("weight", 1.0) for v in rewards.values())
                    if ok else None,
                    metrics=metrics,
                    stop=str(trace.get("stop_condition") or "-"),
                    turns=sum(1 for n in trace.get("nodes") or [] if n.get("sampled")),
                    error="" if ok else str((errors[-1] if errors else {}).get("message", "?")),
                ))  # fmt: skip
            if not episode.get("traces"):
                errors = episode.get("errors") or [{}]
                rows.append(Row(task, "", None, {}, "-", 0, str(errors[-1].get("message", "?"))))
    return rows


def vfops_rows(out: Path) -> list[Row]:
    rows = []
    for path in sorted(out.rglob("results.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            error = row.get("error")
            rows.append(Row(
                task=int(row["example_id"]),
                agent=str(row.get("agent") or ""),
                reward=None if error else row.get("reward"),
                metrics={k: float(v) for k, v in (row.get("metrics") or {}).items()
                         if isinstance(v, (int, float))},
                stop=str((row.get("info") or {}).get("stop_condition") or "-"),
                turns=int(row.get("turns") or 0),
                error=str(error.get("message", error)) if isinstance(error, dict) else "",
            ))  # fmt: skip
    return rows


def shown(venv: Path, log: Path, env: dict[str, str], cwd: Path) -> str:
    """``yes`` when the registry has the run vfops named and ``runs show --rollout 0``
    prints it, else why not."""
    run = re.search(r"^run: (\w+)", log.read_text(errors="replace"), re.MULTILINE)
    if run is None:
        return "-"
    argv = [str(venv / "bin" / "vfops"), "runs", "show", run.group(1), "--rollout", "0"]
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or run.group(1) not in done.stdout:
        return f"NO (runs show exit {done.returncode})"
    return "yes"


def last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):  # the error line, not the traceback's frame
        if re.match(r"^\s*(\w+\.)*\w*(Error|Exception|Exit)\b|error", line):
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else "no output"


# --- comparing ------------------------------------------------------------------------------


def _num(value: float | None) -> str:
    return "err" if value is None else f"{value:.9g}"


def _key_rows(rows: Iterable[Row], agents: bool) -> dict[tuple[int, str], list[Row]]:
    grouped: dict[tuple[int, str], list[Row]] = defaultdict(list)
    for row in rows:
        grouped[(row.task, row.agent if agents else "")].append(row)
    return grouped


def compare(vf: list[Row], ours: list[Row], ignore: set[str]) -> tuple[dict[str, str], str]:
    """Per task (and agent role, when vfops records one): are the multisets equal?"""
    agents = bool(ours) and all(r.agent for r in ours)
    names = {k for r in vf for k in r.metrics} - ignore
    aspects: dict[str, Any] = {
        "rewards": lambda r: _num(r.reward),
        "metrics": lambda r: tuple(
            (k, _num(r.metrics[k]) if k in r.metrics else "absent") for k in sorted(names)
        ),
        "stops": lambda r: r.stop,
        "turns": lambda r: r.turns,
    }  # fmt: skip
    if not vf and not ours:
        return dict.fromkeys(aspects, "-"), ""
    left, right = _key_rows(vf, agents), _key_rows(ours, agents)
    verdicts, first = {}, ""
    for aspect, view in aspects.items():
        equal = True
        for key in sorted(set(left) | set(right)):
            a = Counter(view(r) for r in left.get(key, []))
            b = Counter(view(r) for r in right.get(key, []))
            if a != b:
                equal = False
                if not first:
                    where = f"task {key[0]}" + (f" agent {key[1]}" if key[1] else "")
                    shown_a, shown_b = _show(a), _show(b)
                    first = f"{where}: {aspect} vf-eval {shown_a} vs vfops {shown_b}"
                break
        verdicts[aspect] = "yes" if equal else "NO"
    return verdicts, first


def _show(counter: Counter[Any]) -> str:
    items = sorted(counter.elements(), key=str)
    text = ", ".join(str(i) for i in items)
    return f"[{text[:160]}{'…' if len(text) > 160 else ''}]"


# --- the run --------------------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    name, _, raw = spec.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise SystemExit(f"bad taskset '{spec}': give NAME or NAME:JSON")
    try:
        args = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise SystemExit(f"taskset '{name}': its arguments are not JSON ({exc})") from None
    if not isinstance(args, dict):
        raise SystemExit(f"taskset '{name}': its arguments must be a JSON object")
    return name, args


def fill_stub(value: Any, base_url: str) -> Any:
    if isinstance(value, dict):
        return {k: fill_stub(v, base_url) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_stub(v, base_url) for v in value]
    if isinstance(value, str):
        return value.replace(STUB_PLACEHOLDER, base_url.rstrip("/"))
    return value


def run_pair(spec: str, opts: argparse.Namespace, venv: Path, base_url: str,
             env: dict[str, str], cwd: Path, work: Path, index: int) -> Outcome:  # fmt: skip
    outcome = Outcome(spec)
    name, raw_args = parse_spec(spec)
    args = fill_stub(raw_args, base_url)
    found = probe(venv / "bin" / "python", name, args, env, cwd)
    if "error" in found:
        outcome.why_not = found["error"]
        return outcome
    folder = work / f"{index:02d}-{name}"
    folder.mkdir(parents=True)
    # every role on the subprocess runtime (no container, no account) and on the chat
    # harness vfops's stands for, unless vf-eval is to keep each role's harness as the
    # taskset configures it (its default for a plain taskset: bash)
    keep = opts.vf_harness == "default"
    seats = {
        role: {"runtime": {"type": "subprocess"}, **({} if keep else {"harness": {"id": "null"}})}
        for role in found["roles"]
    }
    config = {"env": {"taskset": args, **seats}}
    (folder / "vf-eval.json").write_text(json.dumps(config))
    counts = ["-n", str(opts.num_examples), "-r", str(opts.rollouts), "-c", str(opts.concurrency)]
    vf_argv = [
        str(venv / "bin" / "vf-eval"), name, "@", str(folder / "vf-eval.json"), "-m", MODEL,
        "--client.base-url", base_url, "--client.api-key-var", KEY_VAR,
        "--no-push", "--no-rich", *counts, "-o", str(folder / "vf"),
    ]  # fmt: skip
    ours_argv = [
        str(venv / "bin" / "vfops"), "eval", name, "-m", MODEL, "-b", base_url, "-k", KEY_VAR,
        *counts, "-o", str(folder / "vfops"), "-a", json.dumps(args),
    ]  # fmt: skip
    for side, argv, reader in (
        (outcome.vf, vf_argv, vf_rows),
        (outcome.ours, ours_argv, vfops_rows),
    ):
        log = folder / f"{side.label}.log"
        side.rc, side.wall_s, side.cpu_s = run_timed(argv, env, cwd, log, opts.timeout)
        out = folder / ("vf" if side is outcome.vf else "vfops")
        side.rows = reader(out) if out.exists() else []
        if side.rc != 0:
            side.note = f"exit {side.rc}: {last_line(log)}"
        if not side.rows and not side.note:
            side.note = "no rollouts recorded"
    outcome.verdicts, outcome.first_difference = compare(
        outcome.vf.rows, outcome.ours.rows, set(opts.ignore_metric)
    )
    outcome.recorded = shown(venv, folder / "vfops.log", env, cwd)
    return outcome


def _mean(rows: list[Row]) -> str:
    scored = [r.reward for r in rows if r.reward is not None]
    return f"{sum(scored) / len(scored):.3f}" if scored else "-"


def _errors(rows: list[Row]) -> str:
    count = sum(1 for r in rows if r.reward is None)
    return f" ({count} err)" if count else ""


def _label(spec: str) -> str:
    """The taskset and the paths of its arguments (``-a dataset_name, task.judges``)."""
    name, args = parse_spec(spec)

    def paths(value: Any, prefix: str) -> list[str]:
        if isinstance(value, dict) and value and prefix.count(".") < 2:
            return [p for k, v in value.items() for p in paths(v, f"{prefix}{k}.")]
        return [prefix.rstrip(".")]

    return f"{name} -a {', '.join(paths(args, ''))}" if args else name


def table(outcomes: list[Outcome]) -> str:
    head = (
        "| taskset | tasks | traces vf-eval / vfops | mean reward vf-eval / vfops | rewards "
        "| metrics | stops | turns | exit vf-eval / vfops | vf-eval s (CPU) | vfops s (CPU) "
        "| vf-eval / vfops wall | vfops run shown |"
    )
    lines = [head, "|" + "---|" * 13]
    for o in outcomes:
        if o.why_not:
            lines.append(f"| {_label(o.spec)} | cannot run: {o.why_not} |" + " |" * 11)
            continue
        tasks = len({r.task for r in o.vf.rows} | {r.task for r in o.ours.rows})
        v = o.verdicts
        ratio = o.vf.wall_s / o.ours.wall_s if o.ours.wall_s else 0.0
        lines.append(
            f"| {_label(o.spec)} | {tasks} | {len(o.vf.rows)}{_errors(o.vf.rows)} / "
            f"{len(o.ours.rows)}{_errors(o.ours.rows)} | {_mean(o.vf.rows)} / "
            f"{_mean(o.ours.rows)} | {v['rewards']} | {v['metrics']} | {v['stops']} | "
            f"{v['turns']} | {o.vf.rc} / {o.ours.rc} | {o.vf.wall_s:.1f} ({o.vf.cpu_s:.1f}) | "
            f"{o.ours.wall_s:.1f} ({o.ours.cpu_s:.1f}) | {ratio:.1f}x | {o.recorded} |"
        )
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """A traceback's or a message's telling line: its last line naming an error, else its
    first, whitespace collapsed."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln for ln in lines if re.search(r"\w(Error|Exception)\b|error:", ln)]
    line = (named or lines or [""])[-1 if named else 0]
    return " ".join(line.split())[:240]


def notes(outcomes: list[Outcome]) -> list[str]:
    found = []
    for o in outcomes:
        parts = [f"{s.label} {s.note}" for s in (o.vf, o.ours) if s.note]
        if o.first_difference:
            parts.append("first difference: " + o.first_difference)
        for side in (o.vf, o.ours):
            failed = next((r.error for r in side.rows if r.error), "")
            if failed:
                parts.append(f"{side.label}'s first rollout error: {_one_line(failed)}")
        if parts:
            found.append(f"- {_label(o.spec)}: " + "; ".join(parts))
    return found


def child_env(venv: Path, home: Path, online: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STRIP_ENV}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["VFOPS_HOME"] = str(home)
    env[KEY_VAR] = "stub"
    if not online:
        env["HF_HUB_OFFLINE"] = env["HF_DATASETS_OFFLINE"] = "1"
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasksets", nargs="+", metavar="NAME[:JSON]")
    parser.add_argument("--venv", type=Path, default=Path(sys.executable).parent.parent,
                        help="virtualenv with vf-eval, vfops and the tasksets (default: this "
                        "Python's)")  # fmt: skip
    parser.add_argument("-n", "--num-examples", type=int, default=4)
    parser.add_argument("-r", "--rollouts", type=int, default=2)
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("--data", type=Path, help="working folder of both evals (local "
                        "stand-ins for hub ids, relative paths in arguments)")  # fmt: skip
    parser.add_argument(
        "--ignore-metric",
        action="append",
        default=[],
        metavar="NAME",
        help="a metric that measures time, left out of the comparison",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per eval")
    parser.add_argument("--online", action="store_true", help="leave the hub reachable")
    parser.add_argument(
        "--vf-harness",
        choices=("null", "default"),
        default="null",
        help="vf-eval's harness for every role: null (the chat loop vfops runs in-process; "
        "the default) or default (as the taskset and its Env configure it); the runtime is "
        "subprocess either way",
    )
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the unmeasured -n 1 -r 1 pair before the first taskset",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run folders")
    parser.add_argument("--json", type=Path, help="write every figure here")
    opts = parser.parse_args()
    for spec in opts.tasksets:
        parse_spec(spec)
    venv = opts.venv.resolve()
    for tool in ("python", "vf-eval", "vfops"):
        if not (venv / "bin" / tool).exists():
            raise SystemExit(
                f"{venv}/bin/{tool} not found: --venv names a virtualenv with "
                "vfops and verifiers 0.4 (make setup-v1 builds .venv-v1)"
            )
    work = Path(tempfile.mkdtemp(prefix="v1-conformance-"))
    cwd = opts.data.resolve() if opts.data else work / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    env = child_env(venv, work / "home", opts.online)
    # sources run from an editable checkout are compiled once, as an install does: with
    # PYTHONDONTWRITEBYTECODE set every start would compile them again
    subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import compileall, os, vfops; "
         "compileall.compile_dir(os.path.dirname(vfops.__file__), quiet=1)"],
        capture_output=True, check=False,
    )  # fmt: skip
    outcomes = []
    with StubServer(StubConfig(reply_mode=scripted_reply)) as stub:
        if not opts.no_warmup:  # the stores of vfops's home and verifiers' program cache
            warm = argparse.Namespace(**{**vars(opts), "num_examples": 1, "rollouts": 1})
            run_pair(opts.tasksets[0], warm, venv, stub.base_url, env, cwd, work / "warmup", 0)
        for index, spec in enumerate(opts.tasksets, 1):
            outcome = run_pair(spec, opts, venv, stub.base_url, env, cwd, work, index)
            outcomes.append(outcome)
            print(table([outcome]).splitlines()[-1], flush=True)
    print(f"\nsettings: -n {opts.num_examples} -r {opts.rollouts} -c {opts.concurrency}, "
          f"vf-eval harness {opts.vf_harness}, scripted endpoint in-process, {venv}, start to "
          "exit (CPU: the process and the children it reaped)\n")  # fmt: skip
    print(table(outcomes))
    for line in notes(outcomes):
        print(line)
    if opts.json:
        opts.json.write_text(json.dumps([
            {"spec": o.spec, "why_not": o.why_not, "verdicts": o.verdicts, "shown": o.recorded,
             "first_difference": o.first_difference,
             **{s.label: {"rc": s.rc, "wall_s": s.wall_s, "cpu_s": s.cpu_s, "note": s.note,
                          "rows": [vars(r) for r in s.rows]} for s in (o.vf, o.ours)}}
            for o in outcomes
        ], indent=1))  # fmt: skip
    if opts.keep:
        print(f"run folders: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
