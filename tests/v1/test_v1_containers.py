"""A v1 task that needs a container runs in one under ``vfops eval``, and scores exactly
as verifiers' own ``vf-eval`` scores it on the same runtime (podman) and image.

``v1_needs_box`` (tests/verifiers_v1_envs) names the image its tasks run in, and one of
its rewards reads the box itself through the runtime (its OS release: tasks 0 and 3
name another release, so that reward is 0 there). vf-eval runs the task's image as
named; vfops runs a task naming an unpullable image with ``--image-map`` pointing it at
the same local image. The image is the project's base image plus what verifiers' chat
program needs inside it offline (uv and the wheels of its dependencies, from the
machine's package index): vf-eval's ``null`` harness runs a uv script in the box, where
vfops runs the same loop in its own process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.sandbox_fixtures import base_image, containers
from vfops.sandbox import RUN_LABEL
from vfops.testing import StubConfig, StubServer

__all__ = ["base_image"]

VENV_BIN = Path(sys.executable).parent
BOX = "localhost/v1-box:vfops-tests"
DECLARED = "registry.example.com/chores/box:1"
"""What vfops's run of the taskset names: no registry has it; --image-map maps it."""
CHAT_DEPENDENCIES = ["openai", "mcp==2.0.0", "httpx", "httpx2", "tenacity", "certifi"]
"""verifiers' chat program's PEP 723 dependencies (verifiers 0.4.0)."""
UV_SHIM = """#!/bin/sh
# offline: uv resolves from the wheels baked into this image (/opt/wheels) only
if [ "$1" = sync ]; then shift; exec /usr/local/lib/uv sync --no-index "$@"; fi
exec /usr/local/lib/uv "$@"
"""


@pytest.fixture(scope="module")
def box_image(base_image: str) -> str:
    """The taskset's box: the base image, uv, and the chat program's wheels."""
    with tempfile.TemporaryDirectory() as folder:
        context = Path(folder)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "-d", str(context / "wheels"),
             *CHAT_DEPENDENCIES],
            check=True, capture_output=True,
        )  # fmt: skip
        (context / "uv").write_bytes((VENV_BIN / "uv").read_bytes())
        (context / "uv-shim").write_text(UV_SHIM)
        (context / "Containerfile").write_text(
            f"FROM {base_image}\nCOPY uv /usr/local/lib/uv\nCOPY uv-shim /usr/local/bin/uv\n"
            "RUN chmod 0755 /usr/local/lib/uv /usr/local/bin/uv\nCOPY wheels /opt/wheels\n"
            "ENV UV_FIND_LINKS=/opt/wheels UV_PYTHON_DOWNLOADS=never\n"
        )
        subprocess.run(
            ["podman", "build", "-q", "--pull=never", "-t", BOX, str(context)],
            check=True, capture_output=True,
        )  # fmt: skip
    return BOX


def reply(request: dict[str, Any]) -> dict[str, Any]:
    """Names the file on even tasks, declines on odd ones."""
    text = request["messages"][-1]["content"]
    found = re.search(r"(/srv/chore-(\d+)\.txt)", text)
    assert found, text
    said = found.group(1) if int(found.group(2)) % 2 == 0 else "I cannot."
    return {"role": "assistant", "content": said}


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode=reply)) as server:
        yield server


def home(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "VFOPS_HOME": str(tmp_path / "home"), "STUB_KEY": "stub"}


def test_a_task_with_an_image_scores_as_vf_eval_scores_it_in_the_same_box(
    box_image: str, stub: StubServer, tmp_path: Path
) -> None:
    n = 4
    theirs = subprocess.run(
        [str(VENV_BIN / "vf-eval"), "v1_needs_box", "-m", "stub-model",
         "--client.base-url", stub.base_url, "--client.api-key-var", "STUB_KEY",
         "--env.agent.harness.id", "null", "--env.agent.runtime.type", "podman",
         "--env.interception.type", "server", "--env.taskset.size", str(n),
         "--env.taskset.image", box_image, "--no-push", "--no-rich", "-n", str(n), "-r", "1",
         "-o", str(tmp_path / "vf")],
        env=home(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    (traces,) = (tmp_path / "vf").rglob("traces.jsonl")
    expected: dict[int, tuple[float, dict[str, float]]] = {}
    for line in traces.read_bytes().splitlines():
        episode = orjson.loads(line)
        (trace,) = episode["traces"]
        assert episode["ok"] and trace["ok"], trace.get("errors")
        rewards = {k: v for k, v in trace["rewards"].items() if v is not None}
        total = sum(v["score"] * v["weight"] for v in rewards.values())
        expected[trace["task"]["data"]["idx"]] = (
            total,
            {k: v["score"] for k, v in rewards.items()},
        )
    # the script and the box are what they say: both rewards 0 and 1 somewhere
    assert {scores["box_is_the_tasks"] for _, scores in expected.values()} == {0.0, 1.0}
    assert {scores["names_the_file"] for _, scores in expected.values()} == {0.0, 1.0}

    ours = subprocess.run(
        [str(VENV_BIN / "vfops"), "eval", "v1_needs_box", "-m", "stub-model",
         "-b", stub.base_url, "-n", str(n), "-r", "1", "-o", str(tmp_path / "out"),
         "--no-tracking", "-a", json.dumps({"size": n, "image": DECLARED}),
         "--image-map", f"{DECLARED}={box_image}"],
        env=home(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr + ours.stdout
    (results,) = (tmp_path / "out").rglob("results.jsonl")
    rows = [orjson.loads(line) for line in results.read_bytes().splitlines()]
    got = {
        row["example_id"]: (row["reward"], {k: row["metrics"][k] for k in expected[0][1]})
        for row in rows
    }
    assert got == expected
    digest = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", box_image],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    for row in rows:  # each rollout records what it ran in
        container = row["info"]["container"]
        assert container["runtime"] == "podman" and container["image"] == box_image
        assert container["declared_image"] == DECLARED
        assert container["image_digest"] in (digest, f"sha256:{digest}")
    metadata = json.loads((results.parent / "metadata.json").read_text())
    assert metadata["image_map"] == {DECLARED: box_image}
    run_id = metadata["run_id"]
    assert containers(RUN_LABEL, run_id) == []  # every box removed with its episode


def test_an_image_not_on_the_host_is_refused_in_one_line(stub: StubServer, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(VENV_BIN / "vfops"), "eval", "v1_needs_box", "-m", "stub-model",
         "-b", stub.base_url, "-n", "2", "-o", str(tmp_path / "out"), "--no-tracking",
         "-a", json.dumps({"image": DECLARED})],
        env=home(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        f"error: task 0 of taskset 'v1_needs_box' needs image '{DECLARED}', which is not on "
        f"this host (podman); build or load it, or run it in a local image with "
        f"--image-map {DECLARED}=LOCAL"
    )
    assert not (tmp_path / "out").exists()
