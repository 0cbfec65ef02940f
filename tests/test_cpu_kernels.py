"""vfops pins PyTorch's CPU kernels to AVX2 on x86 (vfops/_cpu_kernels.py says why: the CPU
recipe learned with them and not with AVX-512 ones), leaving a value the user set."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

SHOW = "import os, vfops; print(os.environ.get('ATEN_CPU_CAPABILITY'))"


def _capability(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
def test_import_vfops_pins_avx2_kernels_unless_set() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    assert _capability(env) == "avx2"
    assert _capability({**env, "ATEN_CPU_CAPABILITY": "default"}) == "default"


def test_torch_sees_the_pinned_kernels() -> None:
    pytest.importorskip("torch")
    code = "import vfops, torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert done.stdout.strip() == "AVX2"
