"""Publishing environments: content hashes, wheels, dataset snapshots, provenance.

Names resolve lazily (PEP 562): an eval records its environment's provenance
(``_provenance``, ``_hashing``) without importing the project reader (pydantic) or
the publisher (build, artifact stores).
"""

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "GcReport": "vfops.publishing._gc",
    "collect_garbage": "vfops.publishing._gc",
    "content_hash": "vfops.publishing._hashing",
    "installed_code_hash": "vfops.publishing._hashing",
    "wheel_code_hash": "vfops.publishing._hashing",
    "EnvironmentProject": "vfops.publishing._project",
    "bumped": "vfops.publishing._project",
    "read_project": "vfops.publishing._project",
    "InstalledEnvironment": "vfops.publishing._provenance",
    "inspect_installed": "vfops.publishing._provenance",
    "PublishResult": "vfops.publishing._publish",
    "environment_store": "vfops.publishing._publish",
    "find_published": "vfops.publishing._publish",
    "install_published": "vfops.publishing._publish",
    "parse_ref": "vfops.publishing._publish",
    "publish_environment": "vfops.publishing._publish",
}

__all__ = [
    "EnvironmentProject",
    "GcReport",
    "InstalledEnvironment",
    "PublishResult",
    "bumped",
    "collect_garbage",
    "content_hash",
    "environment_store",
    "find_published",
    "inspect_installed",
    "install_published",
    "installed_code_hash",
    "parse_ref",
    "publish_environment",
    "read_project",
    "wheel_code_hash",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

if TYPE_CHECKING:
    from vfops.publishing._gc import GcReport, collect_garbage
    from vfops.publishing._hashing import content_hash, installed_code_hash, wheel_code_hash
    from vfops.publishing._project import EnvironmentProject, bumped, read_project
    from vfops.publishing._provenance import InstalledEnvironment, inspect_installed
    from vfops.publishing._publish import (
        PublishResult,
        environment_store,
        find_published,
        install_published,
        parse_ref,
        publish_environment,
    )
