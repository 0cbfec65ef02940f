"""Quiet by default: third-party output that tells a user nothing.

``vfops demo`` and ``vfops train`` print their own progress lines; without
``-v``/``--verbose`` they also set these variables for their run (Prefect's INFO lines
and its temporary server's start/stop notices, progress bars of weight loading, and
transformers' notices). A user's own setting of any of them wins.
"""

from __future__ import annotations

import os

QUIET_ENV: dict[str, str] = {
    # Prefect's flow-run INFO lines, its temporary server's start and stop, its docs link
    "PREFECT_LOGGING_LEVEL": "WARNING",
    # progress bars of model loading and downloads (tqdm honours TQDM_DISABLE)
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}
"""What a quiet command sets, before the libraries are imported."""


def quiet_settings(verbose: bool) -> dict[str, str]:
    """The variables to set for a quiet run: none when ``verbose``, and none a user set."""
    if verbose:
        return {}
    return {name: os.environ.get(name) or value for name, value in QUIET_ENV.items()}
