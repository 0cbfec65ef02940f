"""Who holds an eval run's lease (its own module: the evaluating process builds and
reads one without importing the registry, whose work may run in a child process)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Final

LEASE_TTL_S: Final = 60.0
"""How long a run's lease lasts unless renewed (the running process renews it every
quarter of this): how long a run whose process died on another machine stays locked."""


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
