"""Refuse answers that would bake a project which cannot be imported or installed."""
import keyword
import re
import sys

PROJECT = "{{ cookiecutter.project }}"
PACKAGE = "{{ cookiecutter.package }}"

# Import names the baked project depends on, or that a training environment commonly holds;
# a package of the same name would hide them.
TAKEN = {
    "torch", "torchvision", "hydra", "omegaconf", "cv2", "h5py", "tensorboard", "PIL", "numpy",
    "psutil", "tqdm", "pynvml", "lmdb", "simplejpeg", "turbojpeg", "torchcodec", "litdata", "nvidia", "cookiecutter", "pytest",
    "setuptools", "pip", "scipy", "timm", "ffcv", "lightning", "pytorch_lightning",
}


def refusal() -> str | None:
    if not PROJECT.strip():
        return "project must not be empty"
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", PROJECT):
        return f"project {PROJECT!r} must be letters, digits, '.', '_' or '-' (it names the folder and the distribution)"
    if not PACKAGE.isidentifier() or keyword.iskeyword(PACKAGE):
        return f"package {PACKAGE!r} is not a valid Python identifier; pick one like 'my_project'"
    if PACKAGE in sys.stdlib_module_names or PACKAGE in TAKEN:
        return f"package {PACKAGE!r} would shadow the module of the same name; pick another"
    return None


if __name__ == "__main__":
    reason = refusal()
    if reason:
        print(f"fasttrain: {reason}", file=sys.stderr)
        sys.exit(1)
