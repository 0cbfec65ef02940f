"""Four costs of ``verifiers`` 0.4 that vfops removes in its own process, each behaviour-
preserving, applied once when a v1 taskset is loaded (:func:`before_import` before
``import verifiers.v1``, :func:`install` after it).

Measured on 2,000 single-turn rollouts of a tool-less taskset against a 0 ms stub, CPU
seconds of the rollout loop: 8.25 s as ``verifiers`` ships, 6.34 s with the first, 4.34 s
with both (``bench/v1_eval.py``; ``bench/README.md``).

1. **A default factory's signature, once.** pydantic 2.14 asks
   ``inspect.signature`` of every field's ``default_factory`` on every
   ``model_construct`` (``FieldInfo.default_factory_takes_validated_data`` caches it only
   for private attributes); ``verifiers`` constructs message-graph nodes with
   ``model_construct`` at every turn, and the signature of a builtin such as ``list`` is
   parsed from its text each time. The answer depends on the callable only, so it is
   memoised per callable.
2. **A rollout's working folder only when something uses it.** The ``subprocess``
   runtime makes a folder per rollout at start and removes it in a thread at stop; a
   tool-less rollout never touches it. vfops's runtime is that runtime with the folder
   made on first use (a command, a file, a tool server) and removed only if made. Its
   ``run_uv_script`` (a reward verifying in the runtime) runs the script from a warm
   interpreter (:mod:`vfops.adapters._uv_warm`), not a fresh one per call.
3. **The built-in tasksets only when asked for.** ``verifiers`` finds a taskset by id
   with ``find_spec("verifiers.v1.tasksets.<id>")``, which imports the package
   ``verifiers.v1.tasksets``, whose ``__init__`` imports its built-in tasksets (harbor,
   openenv, nemo_gym and through it ``mcp``): ~0.45 s of CPU at every load of any
   taskset, a refused one included (bench/README.md, refusal_time.py). The package is
   registered on demand (:mod:`vfops._on_demand`): its submodules are found and imported
   as before, and its ``__init__`` runs when one of its own names is first asked for.
4. **Two of ``anthropic``'s types, not all of them.** ``verifiers``' Anthropic dialect
   imports ``Message`` and ``Usage`` from ``anthropic.types``, whose ``__init__`` imports
   every type and, through ``anthropic``'s own ``__init__``, its clients: ~1.1 s of CPU
   of the ~2.7 s ``import verifiers.v1`` costs, paid by every load and refusal, for a
   wire format vfops's harness never speaks. Both packages are registered on demand (as
   in 3) and those two names come from their own submodules
   (``anthropic.types.message``, ``.usage``), the very objects the package would give:
   ~0.25 s (a refusal 2.6 -> 1.8 s of CPU). Any other name, asked for by anyone, runs
   the real ``__init__`` first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vfops._on_demand import on_demand

_INSTALLED = False


def before_import() -> None:
    """What must be in place before ``import verifiers.v1`` (idempotent): 4."""
    _anthropic_types_on_demand()


def install() -> None:
    """Apply 1-3 (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _memoise_factory_signatures()
    _lazy_subprocess_folders()
    _builtin_tasksets_on_demand()
    _INSTALLED = True


def _memoise_factory_signatures() -> None:
    from pydantic._internal import _fields

    original: Callable[[Any], bool] = _fields.takes_validated_data_argument
    known: dict[Any, bool] = {}

    @functools.wraps(original)
    def takes_validated_data_argument(default_factory: Any) -> bool:
        try:
            return known[default_factory]
        except KeyError:
            found = known[default_factory] = original(default_factory)
            return found
        except TypeError:  # unhashable: ask every time, as pydantic does
            return original(default_factory)

    _fields.takes_validated_data_argument = takes_validated_data_argument  # type: ignore[assignment]


def _lazy_subprocess_folders() -> None:
    import verifiers.v1.rollout as rollout
    from verifiers.v1.runtimes.subprocess import CACHE_DIR, SubprocessRuntime

    original = rollout.make_runtime
    lazy = _lazy_runtime_class(SubprocessRuntime, CACHE_DIR / "runtimes" / "subprocess")

    def make_runtime(config: Any, name: str | None = None) -> Any:
        if getattr(config, "type", None) != "subprocess":
            return original(config, name)
        from verifiers.v1.runtimes import register

        runtime = lazy(config, name)
        register(runtime)
        return runtime

    rollout.make_runtime = make_runtime


def _lazy_runtime_class(base: type, folder_root: Any) -> type:
    class LocalRuntime(base):  # type: ignore[misc]
        """``verifiers``' subprocess runtime, its folder made on first use."""

        _made = False

        async def start(self) -> None:
            # SubprocessRuntime.start without its mkdir: the folder's name and the info
            self.workdir = folder_root / self.name
            self.info.id = str(self.workdir)

        def _folder(self) -> None:
            if not self._made and self.workdir is not None:
                self.workdir.mkdir(parents=True, exist_ok=True)
                self._made = True

        async def run(self, *args: Any, **kwargs: Any) -> Any:
            self._folder()
            return await super().run(*args, **kwargs)

        async def open_process(self, *args: Any, **kwargs: Any) -> Any:
            self._folder()
            return await super().open_process(*args, **kwargs)

        async def run_background(self, *args: Any, **kwargs: Any) -> Any:
            self._folder()
            return await super().run_background(*args, **kwargs)

        async def _read(self, *args: Any, **kwargs: Any) -> Any:
            self._folder()
            return await super()._read(*args, **kwargs)

        async def write(self, *args: Any, **kwargs: Any) -> Any:
            self._folder()
            return await super().write(*args, **kwargs)

        async def run_uv_script(
            self, script: str | bytes, args: list[str] | None = None,
            env: dict[str, str] | None = None,
        ) -> Any:  # fmt: skip
            from vfops.adapters._uv_warm import run_warm

            self._folder()
            result = await run_warm(self, script, list(args or []), dict(env or {}))
            if result is None:  # cold, as verifiers runs it
                return await super().run_uv_script(script, args, env)
            return result

        async def teardown(self) -> None:
            if not self._made:
                self.workdir = None  # nothing to remove
            await super().teardown()

    return LocalRuntime


_TASKSETS = "verifiers.v1.tasksets"


def _builtin_tasksets_on_demand() -> None:
    on_demand(_TASKSETS)  # its parent, verifiers.v1, is imported; it is not


_ANTHROPIC_SERVED = {"Message": "message", "Usage": "usage"}
"""The names ``verifiers.v1.dialects.anthropic`` takes from ``anthropic.types``, each with
the submodule that defines it."""


def _anthropic_types_on_demand() -> None:
    if on_demand("anthropic"):  # not imported yet (a taskset may have imported it)
        on_demand("anthropic.types", served=_ANTHROPIC_SERVED)
