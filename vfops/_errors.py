"""User-facing errors: each carries one line naming the problem and the fix."""

from __future__ import annotations


class VfopsError(Exception):
    """An error caused by user input or configuration.

    The CLI prints ``error: <message>`` on one line and exits non-zero, without a
    traceback. The message must name the problem and how to fix it.
    """

    exit_code: int = 2


class InvalidArgumentError(VfopsError, ValueError):
    """A value given to a vfops function or class is out of its range.

    A ``ValueError`` too, so code written against Python's convention catches it; a
    ``VfopsError``, so the CLI prints its one line instead of a traceback.
    """


class EnvironmentNotFoundError(VfopsError):
    """No installed environment package has that name."""


class DatasetFormatError(VfopsError):
    """A dataset row has neither ``prompt`` nor ``question``, or a malformed field."""


class EndpointError(VfopsError):
    """Unknown endpoint alias, missing API-key variable, or unreachable base URL."""


class SandboxError(VfopsError):
    """A sandbox container could not be made or used (its engine or image missing, the
    engine failing): the machinery's failure, never the sandboxed code's (that is a
    result). A rollout that meets one is an error, never scored, and a tool environment
    does not hand it to the model as a tool's output."""


class MissingExtraError(VfopsError):
    """An optional dependency group is not installed."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(
            f"{module} is not installed; install the [{extra}] extra: pip install 'vfops[{extra}]'"
        )
