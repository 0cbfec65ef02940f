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


def name_deepspeed_accelerator() -> None:
    """``DS_ACCELERATOR=cpu`` when torch sees no CUDA device and the user named none.

    DeepSpeed, once installed, is imported by accelerate even for a run that does not
    use it (``save_pretrained`` unwraps the model through it), and on a machine without
    a GPU it then prints a WARNING on stdout that it "was unable to detect" one. vfops
    runs on the CPU exactly then (``Accelerator(cpu=True)``), so that is the accelerator
    to name; DeepSpeed caches its choice for the process, so it is named only when it
    is the right one (a CUDA machine keeps DeepSpeed's own detection). Imports torch.
    """
    if "DS_ACCELERATOR" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def quiet_settings(verbose: bool) -> dict[str, str]:
    """The variables to set for a quiet run: none when ``verbose``, and none a user set."""
    if verbose:
        return {}
    return {name: os.environ.get(name) or value for name, value in QUIET_ENV.items()}
