"""The one-line error of an environment that cannot be built, with the fix for its kind.

Loading an environment runs its package's code (imports, ``load_environment``, dataset
builders), so it fails for reasons of very different kinds; each gets its own fix:
``--env-args`` that do not fit the signature, or values it refused (name the parameters
it takes), a missing module (install it), a dataset or file that cannot be read
(offline: a local path), anything else (a bug in the package). An exception's cause
chain is read too: ``verifiers`` and many dataset loaders wrap the original error in
one of their own.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from vfops._errors import VfopsError

# Exceptions of these libraries that are not OSError are network failures all the
# same (httpx's ConnectError, aiohttp's ClientError...).
_NETWORK_LIBRARIES = frozenset(
    {"aiohttp", "httpcore", "httpx", "huggingface_hub", "requests", "urllib3"}
)

PACKAGE_FIX = "fix the environment package"


def load_failure(
    problem: str,
    exc: BaseException,
    *,
    factory: Callable[..., Any] | None = None,
    env_args: Mapping[str, Any] | None = None,
    otherwise: str = PACKAGE_FIX,
) -> VfopsError:
    """``problem`` (e.g. "load_environment of 'x' raised"), the exception's first line and
    the fix for its kind; ``factory`` is the ``load_environment`` that was called with
    ``env_args`` (None: not a call of it), ``otherwise`` the fix for any other kind."""
    fix = _fix(exc, factory, dict(env_args or {})) or otherwise
    return VfopsError(f"{problem} {first_line(exc)}; {fix}")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (a multi-line message would break the one line):
    its first line with a word in it, colour codes dropped (NLTK's errors open with a
    banner of asterisks)."""
    lines = [_ANSI.sub("", line).strip() for line in str(exc).splitlines()]
    worded = next((line for line in lines if any(c.isalnum() for c in line)), "")
    return f"{type(exc).__name__}: {worded}" if worded else type(exc).__name__


def _fix(exc: BaseException, factory: Callable[..., Any] | None, env_args: dict[str, Any]) -> str:
    for error in _chain(exc):  # the first error of a known kind decides
        if isinstance(error, ImportError):
            return _import_fix(error)
        if isinstance(error, OSError) or _from_network_library(error):
            return _read_fix(factory)
        if isinstance(error, TypeError | ValueError) and factory is not None:
            if not _binds(factory, env_args):
                return (
                    "check --env-args against its load_environment signature "
                    f"({_accepted(factory)})"
                )
            if env_args:  # they bind: a value it refused (a wrong type, out of range)
                return f"check the values in --env-args ({_accepted(factory)})"
    return ""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling (as a traceback shows)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None or current.__suppress_context__:
            current = current.__cause__
        else:
            current = current.__context__


def _import_fix(error: ImportError) -> str:
    if isinstance(error, ModuleNotFoundError) and error.name:
        return (
            f"install the missing module '{error.name}' (pip install the package that "
            "provides it, or reinstall the environment package with its dependencies)"
        )
    return "install the environment package's dependencies (versions it supports)"


def _from_network_library(error: BaseException) -> bool:
    return any(cls.__module__.split(".")[0] in _NETWORK_LIBRARIES for cls in type(error).__mro__)


def _read_fix(factory: Callable[..., Any] | None) -> str:
    fix = "a dataset or file it needs could not be read (offline? pass a local path via --env-args"
    paths = [name for name in _parameters(factory) if _path_like(name)]
    if paths:
        return f"{fix}, e.g. {', '.join(paths)})"
    return f"{fix} if the environment takes one)"


def _path_like(name: str) -> bool:
    return any(word in name for word in ("path", "file", "dir", "dataset", "url"))


def _binds(factory: Callable[..., Any], env_args: dict[str, Any]) -> bool:
    """Whether ``factory(**env_args)`` fits its signature (unknown signature: assume so)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(**env_args)
    except TypeError:
        return False
    return True


def _parameters(factory: Callable[..., Any] | None) -> list[str]:
    """The keyword parameters ``factory`` takes (``**name`` for a catch-all)."""
    if factory is None:
        return []
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return []
    names = []
    for parameter in parameters:
        if parameter.kind is parameter.VAR_KEYWORD:
            names.append(f"**{parameter.name}")
        elif parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            names.append(parameter.name)
    return names


def _accepted(factory: Callable[..., Any] | None) -> str:
    names = _parameters(factory)
    return f"it accepts: {', '.join(names)}" if names else "it takes no arguments"
