"""Where vfops keeps its state, from environment variables (read at call time).

- ``VFOPS_HOME`` (default ``~/.vfops``): the embedded SQLite registry, local artifacts.
- ``VFOPS_DATABASE_URL``: a SQLAlchemy URL (``postgresql+psycopg://...``) for production.
- ``VFOPS_ARTIFACTS``: ``file:///path`` or ``s3://bucket/prefix``
  (default: ``$VFOPS_HOME/artifacts``).
- ``VFOPS_S3_ENDPOINT_URL``: an S3-compatible endpoint (MinIO, moto); credentials come from
  the usual AWS variables and are never stored by vfops.
- ``VFOPS_REGISTRY_RETRY_S`` (default 60): how long an evaluation keeps retrying the
  registry when its database stops answering, before it fails the run (resumable).
- ``VFOPS_TRACE_ROLLOUTS`` (default 100, ``all``, ``off``): how many passing rollouts
  of an eval run are logged as MLflow traces (failed and errored ones always are).
- ``VFOPS_PEER_SYNC_S`` (default 0.5; 0: off): how often an evaluation shares its
  adaptive limiter's 429 pushbacks with other processes through the registry.
- ``VFOPS_SCORING_TIMEOUT_S`` (default 60; 0: no limit): how long one reward function
  call may take before its rollout is recorded with a scoring error (a rubric's
  ``scoring_timeout_s`` overrides it).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Final

from vfops._errors import VfopsError

_writable_homes: set[Path] = set()


def vfops_home() -> Path:
    """The home folder, created if missing; a one-line error unless it can be written
    (checked once per process: the registry, artifacts and MLflow's store all write
    there, and each would otherwise fail with its own traceback)."""
    home = Path(os.environ.get("VFOPS_HOME") or Path.home() / ".vfops").expanduser()
    if home in _writable_homes:
        return home
    from vfops._paths import check_writable_folder

    fix = "set VFOPS_HOME to a writable folder"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        check_writable_folder(home, what="VFOPS_HOME", fix=fix)  # names the file in the way
        raise VfopsError(f"VFOPS_HOME {home} cannot be created ({exc.strerror}); {fix}") from None
    # an existing folder on a read-only file system, or without write permission
    check_writable_folder(home, what="VFOPS_HOME", fix=fix)
    _writable_homes.add(home)
    return home


def database_url() -> str:
    url = os.environ.get("VFOPS_DATABASE_URL")
    if url:
        return url
    return f"sqlite:///{vfops_home() / 'registry.db'}"


def artifacts_uri() -> str:
    uri = os.environ.get("VFOPS_ARTIFACTS")
    if uri:
        return uri
    return (vfops_home() / "artifacts").as_uri()


def s3_endpoint_url() -> str | None:
    return os.environ.get("VFOPS_S3_ENDPOINT_URL") or None


DEFAULT_REGISTRY_RETRY_S: Final = 60.0
"""How long the registry may be unreachable mid-evaluation before the run fails."""


def registry_retry_s() -> float:
    """``VFOPS_REGISTRY_RETRY_S`` (seconds, >= 0), else :data:`DEFAULT_REGISTRY_RETRY_S`."""
    return _seconds("VFOPS_REGISTRY_RETRY_S", DEFAULT_REGISTRY_RETRY_S, ">= 0")


def _seconds(name: str, default: float, rule: str) -> float:
    """A variable holding seconds >= 0 (``rule`` is how the error states the rule)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise VfopsError(f"{name} must be a number of seconds {rule}, not {raw!r}; fix or unset it")
    return value


DEFAULT_PEER_SYNC_S: Final = 0.5
"""Seconds between an evaluation's looks at its endpoint's shared pushbacks: well under
a provider's rate window, and one small query each."""


def peer_sync_s() -> float:
    """``VFOPS_PEER_SYNC_S`` (seconds, >= 0; 0 turns the sharing off), else the default."""
    return _seconds("VFOPS_PEER_SYNC_S", DEFAULT_PEER_SYNC_S, ">= 0 (0: off)")


DEFAULT_SCORING_TIMEOUT_S: Final = 60.0
"""Seconds one reward function call may take: far above a parser or a test runner's
usual seconds, so only a hung (or pathological) call meets it."""


def scoring_timeout_s() -> float:
    """``VFOPS_SCORING_TIMEOUT_S`` (seconds, >= 0; 0: no limit), else the default."""
    return _seconds("VFOPS_SCORING_TIMEOUT_S", DEFAULT_SCORING_TIMEOUT_S, ">= 0 (0: no limit)")


DEFAULT_TRACE_ROLLOUTS: Final = 100
"""How many passing rollouts of a run are logged as MLflow traces at most: MLflow writes
a trace in ~0.1-0.3 s of the tracker's CPU (bench/trace_overhead.py), so a sample keeps a
large run's tracker from holding a core for minutes after the evaluation."""


def trace_rollouts() -> int | None:
    """``VFOPS_TRACE_ROLLOUTS``: how many passing rollouts of an eval run become MLflow
    traces (a sample beyond it; failed and errored rollouts always do), ``all``, or
    ``off`` (no traces: ``None``); default :data:`DEFAULT_TRACE_ROLLOUTS`."""
    raw = (os.environ.get("VFOPS_TRACE_ROLLOUTS") or "").strip().lower()
    if not raw:
        return DEFAULT_TRACE_ROLLOUTS
    if raw in ("off", "none", "no", "false"):
        return None
    if raw == "all":
        return sys.maxsize
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise VfopsError(
            f"VFOPS_TRACE_ROLLOUTS must be a number >= 0, 'all' or 'off', not {raw!r}; "
            "fix or unset it"
        )
    return value
