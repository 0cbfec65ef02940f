"""``vfops eval`` of a verifiers v1 taskset it will not run, or with arguments it refuses,
answers before anything that records a run starts: exit 2, one line naming the problem
and the fix, no process started (no MLflow tracker, no registry child), nothing written.
Tracking and the registry are on, as a user has them. ``v1_needs_box``
(tests/verifiers_v1_envs) is a taskset whose tasks run in a container, refused when its
image is not on the host. Their time is measured in bench/refusal_time.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.refusals import assert_refused, run_refusal
from vfops.testing import StubConfig, StubServer

VFOPS = str(Path(sys.executable).parent / "vfops")

CASES = {
    "task-image-not-on-host": (
        ["v1_needs_box"],
        ["task 0 of taskset 'v1_needs_box' needs image 'localhost/v1-box:latest', which is "
         "not on this host (podman)", "--image-map localhost/v1-box:latest=LOCAL"],
    ),
    "task-needs-container-default-image": (
        ["v1_needs_box", "-a", '{"image": null, "sealed": true}'],
        ["needs image 'docker.io/library/python:3.11-slim'",
         "--image-map docker.io/library/python:3.11-slim=LOCAL"],
    ),
    "image-map-malformed": (
        ["v1_needs_box", "--image-map", "no-equals-sign"],
        ["--image-map takes NAME=LOCAL", "'no-equals-sign'"],
    ),
    "taskset-field-unknown": (
        ["v1_arith", "-a", '{"sizee": 3}'],
        ["taskset 'v1_arith': argument 'sizee'", "set its TasksetConfig fields with -a"],
    ),
    "task-config-field-unknown": (
        ["v1_arith", "-a", '{"task": {"nope": 1}}'],
        ["argument 'task.nope'", 'its TaskConfig\'s under "task"'],
    ),
    "unknown-environment": (
        ["no_such_taskset"],
        ["unknown environment 'no_such_taskset'", "install it with: vfops env install"],
    ),
    "num-examples-0": (["v1_arith", "-n", "0"], ["--num-examples must be positive"]),
    "env-args-not-json": (
        ["v1_arith", "-a", "{bad"],
        ["--env-args is not valid JSON", "pass an object such as"],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    """A loopback endpoint serving "stub-model": the endpoint is checked before the
    taskset loads; it is never asked for a completion (each case is refused first)."""
    with StubServer(StubConfig()) as stub:
        yield stub.base_url


@pytest.mark.parametrize("case", list(CASES))
def test_a_refusal_starts_nothing_and_writes_nothing(
    case: str, live_url: str, tmp_path: Path
) -> None:
    args, phrases = CASES[case]
    refusal = run_refusal(VFOPS, ["eval", *args, "-m", "stub-model", "-b", live_url], tmp_path)
    # is the task's image on the host? the engine's answer is the check
    assert_refused(refusal, *phrases, queries=("'image', 'inspect'",))


def _fresh_python(code: str, tmp_path: Path) -> list[str]:
    """The lines ``code`` prints in a fresh interpreter (its import state is the point)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "VFOPS_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_verifiers_builtin_tasksets_are_imported_only_when_asked_for(tmp_path: Path) -> None:
    """Loading a taskset does not import verifiers' built-in ones (harbor, openenv,
    nemo_gym and mcp: ~0.45 s of every load, a refusal's included); they import as before
    when asked for (vfops/adapters/_v1_speedups.py)."""
    code = (
        "import sys\n"
        "from vfops.envs import load_environment\n"
        "load_environment('v1_arith')\n"
        "print(sorted(m for m in sys.modules if m.startswith('verifiers.v1.tasksets.')))\n"
        "print('mcp' in sys.modules)\n"
        "from verifiers.v1.tasksets import NeMoGymTaskset\n"
        "import verifiers.v1.tasksets.harbor as harbor\n"
        "print(NeMoGymTaskset.__name__, harbor.HarborTaskset.__name__)\n"
    )
    assert _fresh_python(code, tmp_path) == ["[]", "False", "NeMoGymTaskset HarborTaskset"]


def test_anthropic_types_are_imported_only_when_asked_for(tmp_path: Path) -> None:
    """Loading a taskset takes only the two ``anthropic`` types verifiers' Anthropic dialect
    names (from their own modules), not the package's clients and every other type (~1.1 s
    of every load, a refusal's included); the package is whole when asked for, the dialect's
    names the very objects it gives (vfops/adapters/_v1_speedups.py)."""
    code = (
        "import sys\n"
        "from vfops.envs import load_environment\n"
        "load_environment('v1_arith')\n"
        "print('anthropic._client' in sys.modules, 'anthropic.types.beta' in sys.modules)\n"
        "import anthropic\n"
        "from verifiers.v1.dialects import anthropic as dialect\n"
        "print(anthropic.__version__ == __import__('importlib.metadata').metadata"
        ".version('anthropic'))\n"
        "from anthropic.types import Message, MessageParam, Usage\n"
        "print(Message is dialect.AnthropicMessage, Usage is dialect.AnthropicUsage)\n"
        "print(anthropic.AsyncAnthropic.__name__, 'anthropic._client' in sys.modules)\n"
    )
    assert _fresh_python(code, tmp_path) == [
        "False False",
        "True",
        "True True",
        "AsyncAnthropic True",
    ]
