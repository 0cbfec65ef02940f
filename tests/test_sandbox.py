"""vfops.sandbox on a real engine (podman): what the code inside may do, and what it may not.

Each attack a model's code might make — reach the network (the host's loopback services
included), write outside its scratch folder, read the host's environment, fork-bomb,
allocate past its memory, fill its disk, print gigabytes, run forever — is made for real
in a container of the shared base image, and each test checks the attack failed, the
outcome was reported as a result (not an exception) and the host is unharmed. Then the
lifecycle: labels, removal on close, on cancellation, at exit, after ``kill -9`` (by the
next vfops start), the host-wide limit on live containers, and the warm pool.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.sandbox_fixtures import base_image, containers, until
from vfops._rollout_scope import rollout_scope, run_scope
from vfops.sandbox import (
    OWNER_LABEL,
    ROLLOUT_LABEL,
    RUN_LABEL,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxPool,
    collect_garbage,
    engine_named,
    reap_dead_owners,
    run_in_sandbox,
)

__all__ = ["base_image"]

SECRET = "sk-test-must-never-reach-a-container-1234"
SMALL = SandboxLimits(memory_mb=128, pids=32, wall_s=5, output_bytes=100_000, scratch_mb=8)


@pytest.fixture(autouse=True)
def _secret_in_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # an API key in the evaluating process's environment, as a user's would be
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("VFOPS_SANDBOX_STATE_DIR", str(tmp_path / "sandbox-state"))


async def test_a_command_runs_with_files_in_and_out(base_image: str) -> None:
    async with Sandbox(image=base_image, limits=SMALL) as box:
        first = await box.run(
            "python3 -c 'import sys; print(open(\"in.txt\").read().upper()); sys.exit(3)'",
            files={"in.txt": "hello", "nested/data.bin": b"\x00\x01"},
        )
        assert (first.exit_code, first.stdout, first.ok) == (3, "HELLO\n", False)
        second = await box.run_python("open('out.txt', 'w').write('made inside')\nprint(2 + 2)")
        assert second.ok and second.stdout == "4\n" and not second.fresh_container
        files = await box.get_files(["out.txt", "nested/data.bin", "missing.txt"])
        assert files == {"out.txt": b"made inside", "nested/data.bin": b"\x00\x01"}
        with pytest.raises(SandboxError, match="relative path"):
            await box.put_files({"../escape": "x"})


async def test_the_hosts_environment_never_reaches_the_container(base_image: str) -> None:
    result = await run_in_sandbox(
        "env; cat /proc/1/environ; cat /proc/self/environ", image=base_image, limits=SMALL
    )
    assert result.ok
    assert SECRET not in result.stdout + result.stderr
    assert "OPENAI_API_KEY" not in result.stdout


async def test_no_network_not_even_the_hosts_loopback_services(base_image: str) -> None:
    # PostgreSQL listens on the host's 127.0.0.1:5432 (as MLflow and Prefect servers do on
    # theirs): the container's loopback is its own, and it has no other interface
    probe = """
import socket
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "REACHED"
    except OSError as exc:
        return type(exc).__name__
print(reach("127.0.0.1", 5432), reach("10.0.2.2", 5432), reach("1.1.1.1", 53))
try:
    socket.getaddrinfo("pypi.org", 443)
    print("RESOLVED")
except OSError:
    print("no dns")
print(open("/proc/net/dev").read().count(":"))
"""
    async with Sandbox(image=base_image, limits=SMALL) as box:
        result = await box.run_python(probe)
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert "REACHED" not in lines[0] and lines[1] == "no dns"
    assert lines[2] == "1"  # one interface: lo
    host = await asyncio.create_subprocess_exec("pg_isready", "-h", "127.0.0.1", "-p", "5432")
    assert await host.wait() == 0  # the service was there to reach


async def test_the_root_is_read_only_and_the_user_unprivileged(base_image: str) -> None:
    async with Sandbox(image=base_image, limits=SMALL) as box:
        result = await box.run(
            "id -u; touch /etc/owned 2>&1; touch /usr/bin/owned 2>&1; touch /home/x 2>&1; "
            "touch /scratch/ok && echo scratch-ok"
        )
    lines = result.stdout.splitlines()
    assert lines[0] == "65534"
    assert sum("Read-only file system" in line for line in lines) == 3
    assert lines[-1] == "scratch-ok"


async def test_a_fork_bomb_meets_the_process_limit(base_image: str) -> None:
    async with Sandbox(image=base_image, limits=SMALL) as box:
        bomb = await box.run_python(
            "import os\n"
            "for _ in range(1000):\n"
            "    try:\n"
            "        if os.fork() == 0:\n"
            "            import time; time.sleep(30)\n"
            "    except OSError as exc:\n"
            "        print('fork refused:', exc.strerror); break\n",
            wall_s=3,
        )
        assert "fork refused" in bomb.stdout
        after = await run_in_sandbox("echo alive", image=base_image, limits=SMALL)
    assert after.stdout == "alive\n"  # the host goes on starting containers


async def test_memory_past_the_limit_is_killed(base_image: str) -> None:
    result = await run_in_sandbox(
        ["python3", "-c", "x = bytearray(600 * 1024 * 1024); print('allocated')"],
        image=base_image,
        limits=SMALL,
    )
    assert result.killed and "allocated" not in result.stdout
    assert result.describe().startswith("killed")


async def test_a_full_disk_is_the_scratch_folders_own(base_image: str, tmp_path: Path) -> None:
    result = await run_in_sandbox(
        "head -c 50000000 /dev/zero > big; echo $?; df -m /scratch | tail -1",
        image=base_image,
        limits=SMALL,
    )
    assert "No space left on device" in result.stderr
    assert result.stdout.splitlines()[0] != "0"


async def test_gigabytes_of_output_are_cut_at_the_limit(base_image: str) -> None:
    began = time.monotonic()
    async with Sandbox(image=base_image, limits=SMALL) as box:
        flood = await box.run("yes 0123456789abcdef")
        assert flood.output_truncated and flood.exit_code is None and not flood.ok
        assert len(flood.stdout) == SMALL.output_bytes
        # the flooding container was ended; the next command gets a fresh one
        after = await box.run("echo next")
        assert after.fresh_container and after.stdout == "next\n"
    assert time.monotonic() - began < SMALL.wall_s + 20  # cut, not run to its wall time


async def test_a_command_past_its_wall_time_is_killed(base_image: str) -> None:
    async with Sandbox(image=base_image, limits=SMALL) as box:
        await box.run("echo kept > file")
        forever = await box.run("while :; do :; done", wall_s=1.5)
        assert forever.timed_out and not forever.ok and forever.describe().startswith("timed out")
        assert 1.5 <= forever.duration_s < 10
        after = await box.run("cat file 2>&1 || echo gone")
    assert after.fresh_container and "gone" in after.stdout


async def test_containers_carry_their_run_rollout_and_owner(base_image: str) -> None:
    with run_scope("run-abc"), rollout_scope(7, 2):
        async with Sandbox(image=base_image, limits=SMALL) as box:
            container = await box.start()
            labels = engine_named("podman").labels_of([container])
            (mine,) = labels.values()
            assert mine[RUN_LABEL] == "run-abc" and mine[ROLLOUT_LABEL] == "7:2"
            assert mine[OWNER_LABEL].split("-")[1] == str(os.getpid())
            assert containers(RUN_LABEL, "run-abc") == [container[:12]]
    assert containers(RUN_LABEL, "run-abc") == []  # removed on close


async def test_a_cancelled_command_removes_its_container(base_image: str) -> None:
    box = Sandbox(image=base_image, limits=SMALL)
    with run_scope("run-cancel"):
        task = asyncio.ensure_future(_run_then_close(box, "sleep 60"))
        # the state we wait for: the container exists
        await until(lambda: box.container is not None and containers(RUN_LABEL, "run-cancel"))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert containers(RUN_LABEL, "run-cancel") == []


async def _run_then_close(box: Sandbox, command: str) -> None:
    async with box:
        await box.run(command)


OWNER_SCRIPT = """
import asyncio, sys
from vfops._rollout_scope import run_scope
from vfops.sandbox import Sandbox, SandboxLimits

async def main():
    with run_scope(sys.argv[1]):
        box = Sandbox(image=sys.argv[2], limits=SandboxLimits(wall_s=120))
        await box.start()
        print("started", flush=True)
        if sys.argv[3] == "exit":
            sys.exit(0)  # without closing: the interpreter's exit removes it
        await box.run("sleep 120")

asyncio.run(main())
"""


def test_a_process_that_exits_without_closing_leaves_nothing(
    base_image: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", OWNER_SCRIPT, "run-exit", base_image, "exit"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.stdout == "started\n", done.stderr
    assert containers(RUN_LABEL, "run-exit") == []


def test_after_kill_9_the_next_vfops_start_removes_what_it_left(
    base_image: str, tmp_path: Path
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, "run-killed", base_image, "stay"],
        stdout=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    assert owner.stdout is not None and owner.stdout.readline() == "started\n"
    assert len(containers(RUN_LABEL, "run-killed")) == 1
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    owner.stdout.close()
    assert len(containers(RUN_LABEL, "run-killed")) == 1  # nothing ran to remove it
    # any vfops command: its start reaps dead owners' containers before anything else
    version = subprocess.run(
        [sys.executable, "-m", "vfops", "runs", "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert version.returncode == 0, version.stderr
    assert containers(RUN_LABEL, "run-killed") == []
    assert reap_dead_owners() == []  # and its marker went with them


def test_gc_removes_a_dead_owners_containers_and_says_which(
    base_image: str, tmp_path: Path
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, "run-gc", base_image, "stay"],
        stdout=subprocess.PIPE, text=True,
        # its marker goes elsewhere: only the engine knows of its container
        env={**os.environ, "VFOPS_SANDBOX_STATE_DIR": str(tmp_path / "elsewhere")},
    )  # fmt: skip
    assert owner.stdout is not None and owner.stdout.readline() == "started\n"
    (container,) = containers(RUN_LABEL, "run-gc")
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    owner.stdout.close()
    assert reap_dead_owners() == []  # no marker here: the cheap path cannot see it
    done = subprocess.run(
        [sys.executable, "-m", "vfops", "sandbox", "gc"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"removed {container[:12]} (run run-gc" in done.stdout
    assert containers(RUN_LABEL, "run-gc") == []


async def test_a_live_owners_containers_are_left_alone(base_image: str) -> None:
    with run_scope("run-live"):
        async with Sandbox(image=base_image, limits=SMALL) as box:
            container = await box.start()
            report = collect_garbage(engine_named("podman"))
            assert container not in [item.container for item in report.removed]
            assert len(containers(RUN_LABEL, "run-live")) == 1


async def test_the_host_limit_on_live_containers_holds(
    base_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFOPS_SANDBOX_MAX_CONTAINERS", "1")
    first = Sandbox(image=base_image, limits=SMALL)
    await first.start()
    second = Sandbox(image=base_image, limits=SMALL)
    waiting = asyncio.ensure_future(second.start())
    done, _ = await asyncio.wait([waiting], timeout=1.0)
    assert not done  # held back while the first lives
    await first.close()
    await waiting  # then it starts
    await second.close()


async def test_a_pool_hands_out_warm_containers_once(base_image: str) -> None:
    with run_scope("run-pool"):
        async with SandboxPool(1, image=base_image, limits=SMALL) as pool:
            await until(lambda: pool.warm >= 1)  # one started and waiting
            async with pool.sandbox() as box:
                warm = box.container
                assert warm is not None  # handed out started
                assert (await box.run("echo warm > f; cat f")).stdout == "warm\n"
            async with pool.sandbox() as again:
                await again.start()
                assert again.container != warm  # never reused after a piece of work
        assert containers(RUN_LABEL, "run-pool") == []


def test_a_missing_engine_or_image_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SandboxError, match=r"unknown container engine 'nope'.*installed: "):
        Sandbox(engine="nope")
    with pytest.raises(SandboxError, match=r"is not on this host.*vfops sandbox build-image"):
        asyncio.run(run_in_sandbox("true", image="localhost/vfops-no-such-image:1"))
