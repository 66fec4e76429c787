"""`make gpu-check`'s preflight: the CUDA major version torch was built for, against the one the installed
torchcodec (decoder=nvjpeg) and DALI (decoder=dali) wheels were built for. A mismatch is one line naming both
and the wheel to install, before any GPU time is spent on tests that would error.

    python tools/cuda_preflight.py        # exit 0, or 1 with the line on stderr
"""
import importlib.metadata
import re
import sys


def torch_cuda() -> int | None:
    import torch

    return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None


def torchcodec_cuda() -> int | None:
    """The CUDA runtime major version torchcodec's core libraries link to, or None (absent, or a CPU build)."""
    try:
        files = importlib.metadata.files("torchcodec") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith("libtorchcodec_core") and file.name.endswith(".so"):
            found = re.search(rb"libcudart\.so\.(\d+)", file.locate().read_bytes())
            if found:
                return int(found[1])
    return None


def dali_cuda() -> int | None:
    """From the wheel's name: nvidia-dali-cuda130 is built for CUDA 13."""
    for distribution in importlib.metadata.distributions():
        found = re.fullmatch(r"nvidia[-_]dali[-_]cuda(\d+)\d", distribution.metadata["Name"] or "")
        if found:
            return int(found[1])
    return None


def mismatches(torch_major: int | None, wheels: dict[str, int | None]) -> list[str]:
    """One sentence per wheel built for another CUDA major version than torch."""
    if torch_major is None:
        return []
    return [f"torch is built for CUDA {torch_major} and {name} for CUDA {major}: install the {name} wheel for "
            f"CUDA {torch_major} ({hint.format(major=torch_major)}), or a torch built for CUDA {major}"
            for (name, hint), major in wheels.items() if major is not None and major != torch_major]


WHEELS = {("torchcodec", "pip install torchcodec --index-url https://download.pytorch.org/whl/cu{major}0"): torchcodec_cuda,
          ("nvidia-dali", "pip install nvidia-dali-cuda{major}0"): dali_cuda}


def main() -> int:
    found = mismatches(torch_cuda(), {wheel: probe() for wheel, probe in WHEELS.items()})
    if found:
        print(f"error: {'; '.join(found)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
