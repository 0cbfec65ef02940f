"""Command line: ``python -m vfops.testing.stub_server --port 8000 --latency-ms 200``.

Prints ``vfops stub server listening on http://HOST:PORT/v1`` once it listens
(``--port 0`` picks a free port) and serves until interrupted.
"""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import fields
from typing import Any

from vfops.testing._stub_server import FAULT_KINDS, StubConfig, run_stub_server


def _optional(kind: type) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m vfops.testing.stub_server",
        description="OpenAI-compatible stub server (chat completions) for tests and benchmarks.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument(
        "--reply-mode", choices=["echo_answer", "arithmetic"], default="echo_answer"
    )
    for name in ("rate_429", "rate_500", "rate_timeout", "rate_malformed"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=0.0)
    parser.add_argument("--retry-after-s", type=_optional(float), default=0.05)
    parser.add_argument("--timeout-sleep-s", type=float, default=3600.0)
    parser.add_argument("--fail-first-n", type=int, default=0)
    parser.add_argument("--fail-first-kind", choices=FAULT_KINDS, default="500")
    parser.add_argument("--context-limit-chars", type=_optional(int), default=None)
    parser.add_argument("--seed", type=_optional(int), default=0)
    parser.add_argument("--model-name", default="stub-model")
    parser.add_argument("--models-status", type=int, default=200)
    parser.add_argument(
        "--reject-unknown-model", type=lambda text: text.lower() in ("1", "true"), default=False
    )
    parser.add_argument("--api-key", type=_optional(str), default=None)
    parser.add_argument(
        "--echo-key-in-401", type=lambda text: text.lower() in ("1", "true"), default=False
    )
    parser.add_argument("--max-in-flight", type=_optional(int), default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = vars(build_parser().parse_args(argv))
    host, port = args.pop("host"), args.pop("port")
    known = {f.name for f in fields(StubConfig)}
    config = StubConfig(**{k: v for k, v in args.items() if k in known})

    def ready(bound: int) -> None:
        print(f"vfops stub server listening on http://{host}:{bound}/v1", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_stub_server(config, host=host, port=port, on_ready=ready)


if __name__ == "__main__":
    main()
