"""The machine the tests run on (its device, its installed extras) and machines described for the rules that read
the hardware."""
import pytest
import torch

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.hardware import Hardware

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")  # the machine's own: tests run the GPU paths where there is one
CPU = torch.device("cpu")
# Two processes of one job need a GPU each; with fewer, their tests run both on the CPU.
TWO_PROCESSES = {} if torch.cuda.device_count() >= 2 else {"CUDA_VISIBLE_DEVICES": ""}


# Machines described, for the rules that read the hardware: tests never assume the one they run on.
AVX2 = Hardware(device="cpu", cores=2, cpu="AMD EPYC", cpu_flags=(), cpu_capability="AVX2")
AVX512_BF16 = Hardware(device="cpu", cores=64, cpu="Intel Xeon Platinum 8480+", cpu_flags=("avx512_bf16", "amx_bf16"),
                       cpu_capability="AVX512")
SM61 = Hardware(device="cuda", cores=4, cpu="Intel Core", cpu_flags=(), cpu_capability="AVX2", gpu="GTX 1080",
                gpu_capability=(6, 1))
SM70 = Hardware(device="cuda", cores=8, cpu="Intel Xeon", cpu_flags=(), cpu_capability="AVX512", gpu="Tesla V100",
                gpu_capability=(7, 0))
SM90 = Hardware(device="cuda", cores=16, cpu="AMD EPYC", cpu_flags=(), cpu_capability="AVX2", gpu="NVIDIA H100",
                gpu_capability=(9, 0))
MACHINES = {"avx2": AVX2, "avx512_bf16": AVX512_BF16, "sm61": SM61, "sm70": SM70, "sm90": SM90}


def installed(group: str, names: list[str]) -> list:
    """`names` as test parameters, each skipped with the install command where its extra is missing."""
    return [pytest.param(name, marks=pytest.mark.skipif(bool(options.facts(group, name).missing()),
                                                        reason=str(options.facts(group, name).missing())))
            for name in names]


def on_this_machine(choice: str) -> list[str]:
    """The overrides that let `choice` ("group=option") run on this machine: on one without a GPU, the
    settings its facts give for running without one (GPU decoders: their batched path on the CPU)."""
    group, option = choice.split("=")
    return [] if CUDA else options.facts(group, option).overrides_without_gpu(group)
