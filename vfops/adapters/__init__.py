"""Adapters that run environments written for other libraries.

- :class:`VerifiersEnvironment`: an environment package written for ``verifiers``
  (the classic API of its 0.3 line, ``import verifiers as vf``) evaluated, swept,
  gated and trained on by vfops; :func:`load_verifiers_environment` builds one and
  :func:`verifiers_client` is the ``verifiers`` ``Client`` over a vfops client.
  Needs the ``[verifiers]`` extra.
- :class:`TasksetEnvironment`: a taskset written for today's ``verifiers`` (0.4 on, only
  ``verifiers.v1``) run in-process through ``verifiers``' own task, trace and interception
  machinery (:func:`load_taskset_environment`). Needs the ``[verifiers-v1]`` extra.
- :data:`VERIFIERS_V1`: those tasksets as an environment library.
- :data:`VERIFIERS`: ``verifiers`` as an environment library (the plug-in protocol of
  :mod:`vfops.envs`), registered in the ``vfops.environment_libraries`` entry points:
  how the loader, publishing and ``vfops env list`` find and load those packages.

Importing this package imports no ``verifiers``: the names are resolved on first use.
"""

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.adapters._v1 import TasksetEnvironment, load_taskset_environment
    from vfops.adapters._v1_library import VERIFIERS_V1, VerifiersV1Library
    from vfops.adapters._verifiers import (
        SUPPORTED_VERIFIERS,
        VerifiersEnvironment,
        build_verifiers_environment,
        load_verifiers_environment,
        verifiers_client,
        verifiers_version,
    )
    from vfops.adapters._verifiers_library import VERIFIERS, VerifiersLibrary

__all__ = [
    "SUPPORTED_VERIFIERS",
    "VERIFIERS",
    "VERIFIERS_V1",
    "TasksetEnvironment",
    "VerifiersEnvironment",
    "VerifiersLibrary",
    "VerifiersV1Library",
    "build_verifiers_environment",
    "load_taskset_environment",
    "load_verifiers_environment",
    "verifiers_client",
    "verifiers_version",
]

_LAZY = {name: "vfops.adapters._verifiers" for name in __all__}
_LAZY.update(dict.fromkeys(("VERIFIERS", "VerifiersLibrary"), "vfops.adapters._verifiers_library"))
_LAZY.update(
    dict.fromkeys(("TasksetEnvironment", "load_taskset_environment"), "vfops.adapters._v1")
)
_LAZY.update(dict.fromkeys(("VERIFIERS_V1", "VerifiersV1Library"), "vfops.adapters._v1_library"))

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
