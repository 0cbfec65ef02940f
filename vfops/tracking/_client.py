"""Where MLflow lives, and the one way vfops opens it: tracking URI, client, experiments.

Eval runs, training runs and model checkpoints all go through here, so they share one
store. MLflow itself is imported only inside functions (it is heavy).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from vfops._errors import VfopsError

if TYPE_CHECKING:
    from mlflow import MlflowClient

EMBEDDED_DIR: Final = "mlflow"
"""The embedded store's folder under ``VFOPS_HOME`` (``mlflow.db`` and ``artifacts/``)."""

# URI schemes of a store that a separate server holds; any other URI (sqlite, a
# folder, another database) is opened in-process by the client itself.
_SERVER_SCHEMES: Final = ("http://", "https://", "databricks")
_NOISY_LOGGERS: Final = ("mlflow", "mlflow.store.db.utils", "alembic.runtime.migration")


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///$VFOPS_HOME/mlflow/mlflow.db``."""
    configured = os.environ.get("MLFLOW_TRACKING_URI")
    if configured:
        return configured
    from vfops._settings import vfops_home

    folder = vfops_home() / EMBEDDED_DIR
    _make_folder(folder)
    return f"sqlite:///{folder / 'mlflow.db'}"


def _make_folder(folder: Path) -> None:
    """Create a folder of the embedded store; one that cannot be is a one-line error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VfopsError(
            f"cannot create the MLflow store's folder {folder} ({exc.strerror or exc}); "
            "set VFOPS_HOME to a writable folder, MLFLOW_TRACKING_URI, or pass --no-tracking"
        ) from None


def is_embedded(uri: str | None = None) -> bool:
    """True when the store at ``uri`` (default: the configured one) has no tracking server:
    the client opens it in-process, so vfops must say where its artifacts go."""
    if uri is None:
        # not tracking_uri(): that creates the embedded folder
        uri = os.environ.get("MLFLOW_TRACKING_URI") or ""
    return not uri.startswith(_SERVER_SCHEMES)


def artifact_root(uri: str | None = None) -> str | None:
    """Where new experiments keep artifacts: ``VFOPS_MLFLOW_ARTIFACTS``, else, for a store
    without a server, ``$VFOPS_HOME/mlflow/artifacts`` (not MLflow's ``./mlruns`` of the
    working directory), else ``None`` (the tracking server decides, e.g. S3)."""
    configured = os.environ.get("VFOPS_MLFLOW_ARTIFACTS")
    if configured:
        return configured.rstrip("/")
    if is_embedded(uri):
        from vfops._settings import vfops_home

        folder = vfops_home() / EMBEDDED_DIR / "artifacts"
        _make_folder(folder)
        return folder.as_uri()
    return None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence MLflow's own deprecation noise (its store under SQLAlchemy 2.1) and INFO logs."""
    # MLflow sets levels on some child loggers itself (its SQL store announces table
    # creation at INFO): quiet those too, and put every level back afterwards.
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger, level in zip(loggers, levels, strict=True):
        if level == logging.NOTSET or level < logging.WARNING:
            logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"mlflow\b")
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"mlflow\b")
            warnings.filterwarnings("ignore", message=r".*``noload`` loader strategy")
            # imported on the first trace: MLflow's notes on its own type hints
            warnings.filterwarnings("ignore", message=r".*type hint.* is inferred as AnyType")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def mlflow_client(uri: str | None = None) -> MlflowClient:
    """An ``MlflowClient`` on ``uri`` (default: :func:`tracking_uri`), for tracking and
    the model registry alike."""
    uri = uri or tracking_uri()
    with quiet(), _creating_store(uri):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=uri, registry_uri=uri)


_opened_stores: set[str] = set()


@contextlib.contextmanager
def _creating_store(uri: str) -> Iterator[None]:
    """Hold an exclusive lock beside an SQLite store while this process opens it first.

    A fresh store's tables are created under it (whole, in a temporary file renamed
    into place: :mod:`vfops.tracking._sqlite_store`); two processes doing so at once
    would race on it (``table latest_metrics already exists``), e.g. two evaluations
    started together on a new ``VFOPS_HOME``. The lock makes the second wait for the
    first, then find the store whole. Other stores pass.
    """
    if not uri.startswith("sqlite:///") or uri in _opened_stores:
        yield
        return

    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a folder that cannot be written: opening the store says so
        yield
        return
    try:
        _lock_store(fd, path)
        from vfops.tracking._sqlite_store import prepare_store

        # a fresh store is created whole (a temporary file renamed into place), a
        # half-created one rebuilt: a kill at any point never breaks the store for good
        prepare_store(path)
        yield
        _opened_stores.add(uri)
    finally:
        os.close(fd)  # closing releases the lock


class TrackingStoreBusyError(VfopsError):
    """Another process has held an SQLite store's opening lock for too long."""

    exit_code = 4  # busy, as a run another process holds: not bad input


STORE_LOCK_WAIT_S: Final = 120.0
"""How long opening an SQLite store waits for another process opening it
(``VFOPS_MLFLOW_STORE_WAIT_S``): seconds normally; a holder that was stopped (Ctrl-Z,
SIGSTOP) would otherwise hold every later eval of that home forever."""


def _lock_store(fd: int, path: Path) -> None:
    """Take the store's opening lock on ``fd`` (waiting at most
    ``VFOPS_MLFLOW_STORE_WAIT_S``), then write this process's pid into it so a waiter
    can name its holder."""
    import fcntl
    import time

    wait_s = float(os.environ.get("VFOPS_MLFLOW_STORE_WAIT_S") or STORE_LOCK_WAIT_S)
    deadline, pause = time.monotonic() + wait_s, 0.01
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                raise TrackingStoreBusyError(
                    f"process {holder} has been opening the MLflow store {path} for over "
                    f"{wait_s:g} s (its lock: {path}.lock); if that process is "
                    "stopped, continue (fg, kill -CONT) or end it, then run again"
                ) from None
            time.sleep(pause)  # polling a lock another process holds, not a guess
            pause = min(pause * 2, 0.25)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def ensure_experiment(
    client: MlflowClient, name: str, *, artifact_folder: str | None = None
) -> str:
    """The id of experiment ``name``: restored if deleted, created if missing.

    A new experiment keeps its artifacts under :func:`artifact_root` (in
    ``artifact_folder`` below it when given); with no root the server decides.
    """
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return str(experiment.experiment_id)
    root = artifact_root(client.tracking_uri)
    location = root if root is None or artifact_folder is None else f"{root}/{artifact_folder}"
    try:
        return str(client.create_experiment(name, artifact_location=location))
    except MlflowException:
        experiment = client.get_experiment_by_name(name)  # created concurrently
        if experiment is None:
            raise
        return str(experiment.experiment_id)


def safe_folder(name: str) -> str:
    """``name`` as one path segment (for an experiment's artifact folder)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "_"


def check_tracking(uri: str | None = None, *, timeout_s: float = 5.0) -> None:
    """Fail with one line when the configured tracking store cannot be reached.

    Meant to run before an eval starts: an HTTP server must answer ``/health``;
    any other store must answer one experiment search.
    """
    uri = uri or tracking_uri()
    if uri.startswith(("http://", "https://")):
        _check_server(uri, timeout_s)
        return
    from vfops.tracking._sqlite_store import TrackingStoreError

    try:
        with quiet():
            mlflow_client(uri).search_experiments(max_results=1)
    except TrackingStoreError:
        raise  # the store is what is wrong, and it says what to do
    except Exception as exc:
        from vfops.registry import mask_url

        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise VfopsError(
            f"cannot open the MLflow tracking store {mask_url(uri)}: {first}; "
            "fix MLFLOW_TRACKING_URI or pass --no-tracking"
        ) from None


def check_sqlite_store(uri: str) -> None:
    """Fail with one line when an ``sqlite:///PATH`` store's folder is missing or cannot
    be written, or the store is one the tracker could neither open nor rebuild (cheap:
    MLflow is not imported); other stores pass."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    folder = path.parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        problem = (
            f"{path} is a folder"
            if path.is_dir()
            else f"the folder {folder} is missing or not writable"
        )
        raise VfopsError(
            f"cannot open the MLflow tracking store {uri}: {problem}; "
            "fix MLFLOW_TRACKING_URI or pass --no-tracking"
        )
    from vfops.tracking._sqlite_store import check_store_file

    check_store_file(path)  # one that holds runs but cannot be opened: refused now


def _check_server(uri: str, timeout_s: float) -> None:
    # the standard library, not httpx (~0.1 s to import) nor the registry's mask_url
    # (SQLAlchemy): this runs in the evaluating process before its rollouts
    import urllib.error
    import urllib.request

    from vfops.tracking._links import mlflow_ui_base

    shown = mlflow_ui_base(uri) or uri  # without credentials
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.build_opener().open(url, timeout=timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        with exc:
            status = exc.code
    except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections
        reason = getattr(exc, "reason", exc)
        raise VfopsError(
            f"cannot reach the MLflow tracking server at {shown} "
            f"(MLFLOW_TRACKING_URI): {type(exc).__name__}: {reason}; start it, fix the "
            "variable, or pass --no-tracking"
        ) from None
    if status >= 500 or status in (401, 403):
        raise VfopsError(
            f"the MLflow tracking server at {shown} answered HTTP "
            f"{status} on /health; fix it or pass --no-tracking"
        )
