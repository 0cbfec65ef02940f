"""The Prefect flows: thin layers over the library, one module per deployment.

They sit on the top layer beside the CLI (README's Architecture): nothing in vfops imports
them. vfops and Prefect find each by its ``vfops.flows`` entry point
(``nightly-eval = "vfops.flows.nightly:nightly_eval"``, see
:mod:`vfops.orchestration._flows`), and a deployment's entrypoint is the module's file
(``vfops/flows/nightly.py:nightly_eval``). They live inside vfops so that the
distribution installs one top-level package: a user's own ``flows`` package stays theirs.

Importing this package imports no flow (and no Prefect); each module imports Prefect.
"""

__all__: list[str] = []
