"""How far a reader walks to follow one evaluation: the modules an object passes through.

Runs one small in-process evaluation (``arithmetic``, 4 examples x 2 rollouts, against a
loopback stub server; a SQLite registry handed as an engine, so its work runs in this
process's worker threads and is traced too; tracking off) under a profile hook on every
thread, and follows two things through the calls: the ``EvalRequest`` handed to
``evaluate_async``, and ``_loop.run``'s ``RunContext`` with what it carries on (its
``Plan`` and the registry handle: ``RunStore`` and its services now, ``ThreadCalls`` or
``ChildCalls`` before). A call is on a walk when one of its arguments (``*args`` and
``**kwargs`` included) is such an object (matched by class name: the request is copied
on the way in, and the names changed), except the object's own methods (``self``:
reading the class is not following the object elsewhere); only a function's first entry
counts (a coroutine resumed after an ``await`` is the same call); the call's module is
where the reader has to be. The walk is the sequence
of those modules, consecutive repeats collapsed. Printed per object: the modules visited,
the steps, and the returns (a step into a module the walk had already left: the reader
goes back to a file they read before).

    .venv/bin/python bench/eval_walk.py
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/eval_walk.py   # another tree
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any


def _walk(modules: list[str]) -> tuple[list[str], int]:
    steps: list[str] = []
    for module in modules:
        if not steps or steps[-1] != module:
            steps.append(module)
    returns = sum(1 for i, m in enumerate(steps) if m in steps[:i])
    return steps, returns


def main() -> int:
    import vfops
    from vfops.evaluation import EvalRequest, ModelOptions, RunOptions, evaluate_async
    from vfops.testing import StubConfig, StubServer

    print(f"vfops from {Path(vfops.__file__).parent}")
    tracked: dict[str, set[str]] = {
        "request": {"EvalRequest"},
        "context": {
            "RunContext", "Plan", "RunStore", "ThreadService", "ProcessService",
            "ThreadCalls", "ChildCalls",
        },
    }  # fmt: skip
    entered: set[int] = set()
    alive: list[FrameType] = []  # kept so that no id is reused by a later frame
    walks: dict[str, list[str]] = {"request": [], "context": []}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__") or ""
        if not module.startswith("vfops"):
            return
        if id(frame) in entered:
            return  # a coroutine resumed: the same call
        entered.add(id(frame))
        alive.append(frame)
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        names = list(code.co_varnames[:count])
        flags = code.co_flags
        if flags & 0x04:  # *args
            names.append(code.co_varnames[count])
        if flags & 0x08:  # **kwargs
            names.append(code.co_varnames[count + bool(flags & 0x04)])
        values: list[Any] = []
        for name in names:
            value = frame.f_locals.get(name)
            if isinstance(value, tuple):
                values.extend(value)
            elif isinstance(value, dict) and name not in names[:count]:
                values.extend(value.values())
            else:
                values.append(value)
        own = type(frame.f_locals.get("self")).__name__
        for label, kinds in tracked.items():
            if own in kinds:
                continue
            if any(type(v).__name__ in kinds for v in values):
                walks[label].append(module)

    async def run(base_url: str, out: Path) -> None:
        request = EvalRequest(
            env_name="arithmetic", model="stub-model", num_examples=4, rollouts_per_example=2
        )
        from vfops.registry import get_engine

        engine = get_engine(f"sqlite:///{out.parent / 'registry.db'}")
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            result = await evaluate_async(
                request,
                RunOptions(tracking=False, output_root=out, engine=engine),
                model_options=ModelOptions(base_url=base_url),
            )
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        print(f"run {result.run_id}: {result.status}")

    stub_config = StubConfig(reply_mode="arithmetic")
    with tempfile.TemporaryDirectory() as tmp, StubServer(stub_config) as stub:
        os.environ["VFOPS_HOME"] = str(Path(tmp) / "home")
        os.environ.pop("VFOPS_DATABASE_URL", None)
        asyncio.run(run(stub.base_url, Path(tmp) / "out"))
    for label, modules in walks.items():
        steps, returns = _walk(modules)
        print(
            f"{label}: {len(set(steps))} modules, {len(steps)} steps, {returns} returns: "
            + " > ".join(m.removeprefix("vfops.") for m in steps)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
