"""Where the flow definitions are: the ``vfops.flows`` entry points, never an import by name.

The flows live in ``vfops.flows``, on the top layer beside the CLI, so nothing below may
import them; vfops reaches them through the entry points its ``pyproject.toml`` declares
(``nightly-eval = "vfops.flows.nightly:nightly_eval"``), keyed by deployment name. A deployment
needs only the entry point's file and function (Prefect loads the flow itself, on the
worker); the demo needs the flow object (:func:`load_flow`). Either way the flows are
found by a string, so vfops imports no flow module by name and a flow moved or added is
one line of ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from vfops._errors import VfopsError

FLOW_GROUP = "vfops.flows"
"""The entry-point group naming every deployable flow (``name = "module:function"``)."""


@dataclass(frozen=True)
class FlowRef:
    """A flow by entry point: ``module:function``, and the folder its package sits in."""

    name: str
    module: str
    function: str
    root: Path

    @property
    def entrypoint(self) -> str:
        """Prefect's form, relative to :attr:`root`: ``vfops/flows/nightly.py:nightly_eval``."""
        return f"{self.module.replace('.', '/')}.py:{self.function}"


def flow_entry_points() -> dict[str, EntryPoint]:
    """The registered flows, by name (none when vfops' metadata is missing: a source tree
    run without being installed)."""
    return {ep.name: ep for ep in entry_points(group=FLOW_GROUP)}


def flow_ref(name: str) -> FlowRef | None:
    """Flow ``name``'s module, function and source folder, found without importing it;
    ``None`` when no such entry point is registered or its module is not installed."""
    ep = flow_entry_points().get(name)
    if ep is None:
        return None
    module, _, function = ep.value.partition(":")
    try:
        # the module's file, not the module: importing a flow imports Prefect
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).resolve().parents[module.count(".")]
    return FlowRef(name=name, module=module, function=function.strip(), root=root)


def load_flow(name: str) -> Any:
    """The flow object of entry point ``name`` (importing its module imports Prefect)."""
    ep = flow_entry_points().get(name)
    if ep is None:
        raise VfopsError(
            f"no flow {name!r} is registered (entry-point group {FLOW_GROUP}); install "
            "vfops (pip install vfops, or pip install -e . in a checkout) so that its "
            "metadata names its flows"
        )
    return ep.load()
