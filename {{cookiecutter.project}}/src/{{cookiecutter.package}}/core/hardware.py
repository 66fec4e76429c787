"""What this machine can do, asked of the hardware: the facts that decide which advice applies here.

A switch that doubles speed on one machine can cost 25x on another: bf16 autocast runs on native units on
Ampere GPUs and on CPUs with AVX-512-BF16 or AMX, and is emulated, element by element, elsewhere. The
advice, tune and the start-up warnings read `Hardware`, never assume it; tests describe machines with it.
"""
import os
import platform
import time
from dataclasses import asdict, dataclass

import torch

NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86's two, Arm's (ARMv8.6 BF16)
BF16_CUDA = (8, 0)  # Ampere: bf16 tensor cores
TENSOR_CORES_CUDA = (7, 0)  # Volta: fp16 tensor cores, which read NHWC


@dataclass(frozen=True)
class Hardware:
    device: str  # cpu | cuda: where the step runs
    cores: int  # CPU cores this process may use: its affinity, shared among the local processes
    cpu: str  # the CPU's model name
    cpu_flags: tuple[str, ...]  # the CPU's feature flags that the rules below read
    cpu_capability: str  # torch's vector kernels: AVX2, AVX512, SVE256, ...
    gpu: str = ""  # the GPU's name, if the step runs on one
    gpu_capability: tuple[int, int] | None = None  # CUDA compute capability

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def processor(self) -> str:
        """The device as the report names it: GPU or CPU."""
        return "GPU" if self.on_gpu else "CPU"

    @property
    def native_bf16(self) -> bool:
        if self.on_gpu:
            return self.gpu_capability is not None and tuple(self.gpu_capability) >= BF16_CUDA
        return any(flag in self.cpu_flags for flag in NATIVE_BF16_CPU_FLAGS)

    @property
    def tensor_cores(self) -> bool:
        return self.on_gpu and self.gpu_capability is not None and tuple(self.gpu_capability) >= TENSOR_CORES_CUDA

    @property
    def bf16_fact(self) -> str:
        """Why bf16 is native here or not, in the hardware's own terms."""
        if self.on_gpu:
            major, minor = self.gpu_capability or (0, 0)
            native = "bf16 tensor cores" if self.native_bf16 else "no bf16 tensor cores (they start at 8.0, Ampere)"
            return f"{self.gpu} has compute capability {major}.{minor}: {native}"
        if self.native_bf16:
            flags = ", ".join(flag for flag in NATIVE_BF16_CPU_FLAGS if flag in self.cpu_flags)
            return f"{self.cpu} has native bf16 ({flags})"
        return (f"{self.cpu} has no native bf16 (no avx512_bf16, amx_bf16 or bf16 CPU flag; torch's kernels: "
                f"{self.cpu_capability}): bf16 is emulated")

    @property
    def gpu_fact(self) -> str:
        major, minor = self.gpu_capability or (0, 0)
        return f"{self.gpu}, compute capability {major}.{minor}"

    def record(self) -> dict:
        """As summary.json keeps it; `Hardware(**record)` reads it back."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> "Hardware":
        capability = record.get("gpu_capability")
        return cls(**{**record, "cpu_flags": tuple(record["cpu_flags"]),
                      "gpu_capability": tuple(capability) if capability else None})


def cores_per_process() -> int:
    """The cores this process may use, shared among the processes torchrun started on this node."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def cpu_description() -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and those of its flags that the rules read, from /proc/cpuinfo where there is one."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip().lower(), value.strip())  # the first processor's
    except OSError:
        pass
    model = fields.get("model name") or platform.processor() or platform.machine()
    flags = set((fields.get("flags") or fields.get("features") or "").split())  # x86 | Arm
    return model, tuple(flag for flag in NATIVE_BF16_CPU_FLAGS if flag in flags)


def probe(device: torch.device) -> Hardware:
    """This machine, as the rules see it."""
    cpu, flags = cpu_description()
    common = {"cores": cores_per_process(), "cpu": cpu, "cpu_flags": flags,
              "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if device.type != "cuda":
        return Hardware(device=device.type, **common)
    return Hardware(device="cuda", gpu=torch.cuda.get_device_name(device),
                    gpu_capability=tuple(torch.cuda.get_device_capability(device)), **common)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device`: a GPU's kernels run after the host has moved on."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bf16_slowdown(device: torch.device, repeats: int = 5) -> float:
    """How many times longer a 3x3 convolution takes under bf16 autocast than in fp32 on `device`: measured,
    in about a second where bf16 is emulated."""
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(device)
    images = torch.randn(8, 64, 28, 28, device=device)

    def seconds(dtype: torch.dtype | None) -> float:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype is not None):
            conv(images)  # warm-up: kernel choice, allocation
            synchronize(device)
            start = time.perf_counter()
            for _ in range(repeats):
                conv(images)
            synchronize(device)
            return time.perf_counter() - start

    return seconds(torch.bfloat16) / max(seconds(None), 1e-9)
