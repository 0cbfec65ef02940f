"""``vfops eval`` refusals answer before anything that records a run starts: exit 2, one
line naming the problem and the fix, no process started (no MLflow tracker, no registry
child), nothing written (no run folder, registry, MLflow store). Tracking and the
registry are on, as a user has them. Their time is measured in bench/refusal_time.py;
the v1 tasksets' refusals are tests/v1/test_v1_refusals.py."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.refusals import assert_refused, run_refusal
from vfops.testing import StubConfig, StubServer

VFOPS = str(Path(sys.executable).parent / "vfops")


def _closed_url() -> str:
    """A loopback URL nothing listens on (a port just given back by the system)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# {live}: a loopback endpoint serving "stub-model", never asked for a completion (every
# case is refused before a rollout); {closed}: one nothing listens on
CASES = {
    "unknown-environment": (
        ["eval", "no_such_env", "-b", "{closed}"],
        ["unknown environment 'no_such_env'", "install it with: vfops env install"],
    ),
    "num-examples-0": (["eval", "vf_guess", "-n", "0"], ["--num-examples must be positive"]),
    "temperature-below-0": (
        ["eval", "vf_guess", "--temperature", "-1"],
        ["temperature must be >= 0", "--temperature or --sampling-args"],
    ),
    "env-args-not-json": (
        ["eval", "vf_guess", "-a", "{bad"],
        ["--env-args is not valid JSON", "pass an object such as"],
    ),
    # a classic verifiers environment's loader refuses a value: one line (verifiers'
    # own log of the failure is not shown), the package's parameters named
    "classic-env-arg-refused": (
        ["eval", "vf_guess", "-a", '{"stop_mode": "nope"}', "-b", "{live}"],
        ["unknown stop_mode 'nope'", "check the values in --env-args", "stop_mode"],
    ),
    # the endpoint is checked before the recorders start, and before the environment
    # loads (seconds of imports): the bad -a value here is never reached
    "endpoint-unreachable": (
        ["eval", "vf_guess", "-a", '{"stop_mode": "nope"}', "-b", "{closed}"],
        ["cannot reach base URL", "check --base-url"],
    ),
    "model-not-served": (
        ["eval", "vf_guess", "-a", '{"stop_mode": "nope"}', "-b", "{live}", "-m", "other"],
        ["model 'other' is not served", "it serves stub-model"],
    ),
}


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    with StubServer(StubConfig()) as stub:
        yield stub.base_url


@pytest.mark.parametrize("case", list(CASES))
def test_a_refusal_starts_nothing_and_writes_nothing(
    case: str, live_url: str, tmp_path: Path
) -> None:
    args, phrases = CASES[case]
    urls = {"{closed}": _closed_url(), "{live}": live_url}
    argv = [urls.get(arg, arg) for arg in args]
    if "-b" not in argv:
        argv += ["-b", urls["{closed}"]]  # never reached: refused before the endpoint is asked
    if "-m" not in argv:
        argv += ["-m", "stub-model"]
    refusal = run_refusal(VFOPS, argv, tmp_path)
    assert_refused(refusal, *phrases)
