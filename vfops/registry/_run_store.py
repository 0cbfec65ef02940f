"""An evaluation's run in the registry, by what it does: :class:`RunStore`.

Every read and write of an eval run's rows that an evaluation makes goes through these
methods: open (create, resume or reuse) under a lease, insert a batch of rollouts, renew
and release the lease, record the end, link the MLflow run, and the reads a resume or a
reused run needs. Each is one named operation of the registry service
(:mod:`vfops.registry._service`), run where the service runs it: a worker thread, the
tracker process or a registry child. This module is light (no SQLAlchemy): the
evaluating process imports it, the operations themselves
(:mod:`vfops.registry._run_ops`) load only where they run.

The requests and answers are plain frozen dataclasses (they cross a pipe).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson

if TYPE_CHECKING:
    from vfops._lease import LeaseOwner
    from vfops._rollout import RolloutRecord
    from vfops.registry._service import RegistryService
    from vfops.stats import EvalSummary

Existing = Literal["new", "resume", "reuse"]
OpenAction = Literal["created", "resumed", "reused"]


@dataclass(frozen=True)
class InstalledCode:
    """The environment code the evaluating process has installed (its name, content
    hash, the ``local+<hash>`` label it runs under when unpublished, and the library it
    was written for)."""

    env_name: str
    code_hash: str
    local_label: str
    library: str = "vfops"
    library_version: str | None = None

    @property
    def library_label(self) -> str | None:
        """``verifiers==0.3.1`` for code written for another library; None for vfops's."""
        if self.library == "vfops":
            return None
        return f"{self.library}=={self.library_version or 'unknown'}"


@dataclass(frozen=True)
class RunOpening:
    """What opening an eval run works from.

    ``identity``: everything that changes what the run produces except the code's
    version (the request's identity and base URL); the registry adds the version it
    finds for ``code`` and hashes both into the run's fingerprint (:func:`run_fingerprint`).
    ``run_id`` and ``run_dir``: a new run's id and folder, chosen by the caller (so its
    first rollouts can run while the registry records it). ``resume``: the run id or
    folder of ``--resume``; ``resume_run_id``: the id it names (read from the folder's
    metadata by the caller).
    """

    code: InstalledCode
    identity: dict[str, Any]
    model: str
    base_url: str | None
    sampling_args: dict[str, Any]
    env_args: dict[str, Any]
    num_examples: int
    rollouts_per_example: int
    tags: list[str]
    run_id: str
    run_dir: str
    output_root: str
    pid: int
    existing: Existing = "new"
    resume: str | None = None
    resume_run_id: str | None = None


@dataclass(frozen=True)
class RunOpened:
    """The registry's answer to :class:`RunOpening`: which run, in which folder, what it
    already holds, and the lease this evaluation holds on it (None for a reused run)."""

    action: OpenAction
    run_id: str
    run_dir: str
    version: str
    """The published version whose code is the installed code, else its ``local+`` label."""
    version_id: int | None
    lease: LeaseOwner | None
    done: frozenset[tuple[int, int]] = field(default_factory=frozenset)
    """(example, rollout) keys already stored (a resumed run)."""
    resume_folder: bool = False
    """The run continues in a folder that holds its earlier work."""


def run_fingerprint(identity: dict[str, Any], version: str, code: InstalledCode) -> str:
    """What makes two runs the same run: the hash of the request's identity, the code's
    version and hash, and (for another library's code) that library's version."""
    data = {**identity, "env_version": version, "code_hash": code.code_hash}
    if code.library_label is not None:  # absent for vfops environments: ids unchanged
        data["library"] = code.library_label
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


class RunStore:
    """An evaluation's runs in the registry, through ``service`` (one of
    :class:`~vfops.registry.ThreadService`, :class:`~vfops.registry.ProcessService`).

    Connection failures raise :class:`~vfops.registry.RegistryUnavailable` (worth
    retrying); a lease another process took, :class:`~vfops.registry.LeaseLostError`.
    """

    def __init__(self, service: RegistryService) -> None:
        self.service = service

    @property
    def database_url(self) -> str:
        return self.service.database_url

    async def open(self, opening: RunOpening) -> RunOpened:
        """Create, resume or reuse the run, taking its lease (refused, naming the holder,
        while another live process holds it)."""
        opened: RunOpened = await self.service.call("run.open", opening)
        return opened

    async def insert(
        self, run_id: str, records: list[RolloutRecord], lease: LeaseOwner | None
    ) -> int:
        """Store a batch of scored rollouts, fenced by ``lease``; how many were new."""
        inserted: int = await self.service.call("run.insert", run_id, records, lease)
        return inserted

    async def renew_lease(self, run_id: str, lease: LeaseOwner) -> bool:
        """Extend the lease; False when it had lapsed (and nobody else took it)."""
        renewed: bool = await self.service.call("run.renew_lease", run_id, lease)
        return renewed

    async def hold_lease(self, run_id: str, lease: LeaseOwner) -> None:
        """Raise :class:`~vfops.registry.LeaseLostError` unless ``lease`` still holds it."""
        await self.service.call("run.hold_lease", run_id, lease)

    async def release_lease(self, run_id: str, lease: LeaseOwner) -> None:
        """The run free for the next process at once."""
        await self.service.call("run.release_lease", run_id, lease)

    async def record_end(
        self, run_id: str, status: str, summary: dict[str, Any], lease: LeaseOwner | None
    ) -> None:
        """The run's status and summary, only while ``lease`` holds it (kept held)."""
        await self.service.call("run.record_end", run_id, status, summary, lease)

    async def link_mlflow(self, run_id: str, mlflow_run_id: str) -> None:
        """Store the MLflow run's id on the run."""
        await self.service.call("run.link_mlflow", run_id, mlflow_run_id)

    async def record(self, run_id: str) -> dict[str, Any]:
        """The run's row as plain values (:func:`vfops.registry.run_record`)."""
        found: dict[str, Any] = await self.service.call("run.record", run_id)
        return found

    async def summary(self, run_id: str, pass_threshold: float = 1.0) -> EvalSummary:
        """Statistics of every rollout of the run stored."""
        summary: EvalSummary = await self.service.call("run.summary", run_id, pass_threshold)
        return summary

    async def rollouts(self, run_id: str, keys: set[tuple[int, int]]) -> list[RolloutRecord]:
        """The stored rollouts of ``keys`` (one pass over the run's rows)."""
        found: list[RolloutRecord] = await self.service.call("run.rollouts", run_id, keys)
        return found

    async def aclose(self) -> None:
        await self.service.aclose()
