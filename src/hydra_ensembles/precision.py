"""Whether this CPU runs bfloat16 in hardware, and the warning where it does not: without bf16 matrix instructions
oneDNN emulates bf16 with fp32 ones, and a bf16 matrix product takes several times an fp32 one (4.7x for a
(512, 768) x (768, 3072) product on a 2-core AVX512 Xeon without AVX512-BF16, one thread), so bf16 inference or
training there is slower than fp32, not faster."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

# /proc/cpuinfo flags of bf16 matrix instructions: x86 AVX512-BF16 and AMX, ARM's BF16 extension
BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16, AMX or ARM BF16), as torch's CPU
    checks or the kernel's CPU flags say. Without, oneDNN emulates bf16 with fp32 instructions."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private: absent from some torch builds
    if any(getattr(torch.cpu, check, lambda: False)() for check in checks):
        return True
    return bool(BF16_CPU_FLAGS & cpu_flags())


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo ("flags" on x86, "Features" on ARM); empty
    where there is no such file."""
    if not cpuinfo.exists():
        return set()
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def warn_if_emulated_bf16(precision: str, device_type: str, work: str, stacklevel: int = 3) -> None:
    """Warn that `work` ("inference", "training") at `precision` will be slow when it is bf16 on a CPU that
    emulates it."""
    if precision == "bf16" and device_type == "cpu" and not native_bf16_cpu():
        warnings.warn(
            f"bf16 {work} on this CPU will be slow: it has no bf16 matrix instructions (AVX512-BF16 or AMX; ARM "
            "BF16), so bfloat16 is emulated and runs slower than fp32. Use --precision fp32 (precision='fp32') here.",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
