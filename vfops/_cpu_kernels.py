"""The same numbers from a CPU run on any x86 machine: PyTorch's own CPU kernels pinned
to their AVX2 build.

PyTorch picks its vectorised CPU kernels (softmax, reductions, element-wise ops) by the
instruction set it finds: AVX-512 on some machines, AVX2 on others. Their results differ
in the last bits, and an RL run on a tiny model amplifies that: the shipped CPU recipe
(configs/train/cpu_lucky_digit.toml, seed 0, 200 steps) took its held-out reward from 0.0
to 1.0 with the AVX2 kernels and settled at 0.35 with the AVX-512 ones (2026-12-05, an AMD
EPYC with AVX-512). The pin makes one machine's run comparable with another's; it does
not make the recipe reach 1.0 everywhere (thread counts and matrix-product libraries
still differ; README "Training"). So vfops asks for AVX2 (``ATEN_CPU_CAPABILITY``, read by
PyTorch at its first kernel call) unless the variable is set:
``ATEN_CPU_CAPABILITY=default`` gives PyTorch back its choice. GPU work is not affected.
"""

from __future__ import annotations

import os
import platform

_X86 = frozenset({"x86_64", "amd64", "i686", "x86"})


def pin_cpu_kernels() -> None:
    """``ATEN_CPU_CAPABILITY=avx2`` on x86 unless set; before torch's first kernel call."""
    if platform.machine().lower() in _X86:
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
