"""Who holds an eval run's lease (its own module: the evaluating process builds and
reads one, and learns it lost one, without importing the registry, whose work may run
in a child process).

The lease is also the run's fencing token: every write that belongs to the run's
holder (its rollouts, the lease's renewals, the run's end) is made only while that
holder still holds it (:func:`vfops.registry.hold_run_lease`), so a holder that was
paused or cut off past its lease, and came back after another process took the run
over, writes nothing more (:class:`LeaseLostError`).
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Final

from vfops._errors import VfopsError

DEFAULT_LEASE_TTL_S: Final = 60.0


def _lease_ttl_s() -> float:
    """``VFOPS_LEASE_TTL_S`` (seconds, > 0), else :data:`DEFAULT_LEASE_TTL_S`; read once,
    when this module is imported (every process of one run must agree on it)."""
    raw = os.environ.get("VFOPS_LEASE_TTL_S")
    if not raw:
        return DEFAULT_LEASE_TTL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise VfopsError(
            f"VFOPS_LEASE_TTL_S must be a number of seconds > 0, not {raw!r}; fix or unset it"
        )
    return value


LEASE_TTL_S: Final = _lease_ttl_s()
"""How long a run's lease lasts unless renewed (the running process renews it every
quarter of this): how long a run whose process died on another machine, or was paused,
stays locked. ``VFOPS_LEASE_TTL_S`` (default 60) sets it."""


class RunBusyError(VfopsError):
    """Another process holds the run's lease (or its folder's lock)."""

    exit_code = 4


class LeaseLostError(RunBusyError):
    """This process's lease on a run was taken over (it lapsed while the process was
    paused or cut off): the process writes nothing more to the run and stops."""


@dataclass(frozen=True)
class LeaseOwner:
    """Who works on a run: a host, a process and a token unique to one evaluation."""

    host: str
    pid: int
    token: str

    @classmethod
    def this_process(cls) -> LeaseOwner:
        return cls.for_process(os.getpid())

    @classmethod
    def for_process(cls, pid: int) -> LeaseOwner:
        """A new lease of process ``pid`` of this host (the evaluating process, also
        when a helper process of its writes to the registry for it)."""
        return cls(socket.gethostname(), pid, uuid.uuid4().hex[:12])

    @classmethod
    def parse(cls, text: str) -> LeaseOwner:
        host, _, rest = text.rpartition("@")
        pid, _, token = rest.partition(":")
        return cls(host, int(pid) if pid.isdigit() else -1, token)

    def __str__(self) -> str:
        return f"{self.host}@{self.pid}:{self.token}"

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}"

    def is_dead(self) -> bool:
        """Known dead: a process of this host that no longer exists (another host's
        process cannot be checked: its lease must expire)."""
        if self.host != socket.gethostname() or self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False
