"""Publishing environments: content hashes, wheels, dataset snapshots, provenance."""

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
