"""The GPU check's first stage: nvJPEG's batched decode (decoder=nvjpeg) through each backend, its pixels against
Pillow's and its rate, on the training JPEGs of the check's own data set."""
import time
import warnings
from pathlib import Path

import torch
from hydra import compose
from omegaconf import DictConfig

from ...core.config import build
from ...data.decoder import pillow_decode
from ...data.decoder.nvjpeg import BACKENDS, TORCHVISION_DEPRECATION

# The mean absolute difference from Pillow, in levels of 255, within which a decode is the same image: nvJPEG's
# inverse DCT and chroma upsampling differ from libjpeg's by a level here and there, a wrong decode by tens.
PIXEL_TOLERANCE = 1.0
JPEG = (".jpg", ".jpeg")


def training_jpegs(cfg: DictConfig, count: int) -> list[Path]:
    """The first `count` training JPEGs of the data set every run of the check reads (its `common` overrides),
    written first where it is the built-in one and not written yet."""
    source = build(compose("train", overrides=list(cfg.gpu_check.common)).data)
    return sorted(path for path in (source.root / "train").rglob("*") if path.suffix.lower() in JPEG)[:count]


def decode_rows(files: list[Path], device: torch.device, backends: list[str], repeats: int) -> list[dict]:
    """One row per backend: its decode rate, one batched call for all `files` at a time, and how far its pixels are
    from Pillow's; or why it did not run."""
    data = [path.read_bytes() for path in files]
    encoded = [torch.frombuffer(bytearray(raw), dtype=torch.uint8) for raw in data]
    reference = [torch.tensor(pillow_decode(raw, shrink=1)).permute(2, 0, 1) for raw in data]
    rows = []
    for backend in backends:
        decode, refusal = BACKENDS[backend]
        row = {"name": f"nvjpeg/{backend}", "command": f"decoder.backend={backend}"}
        if why := refusal():
            rows.append({**row, "status": f"not run: {why}"})
            continue
        try:
            with warnings.catch_warnings():  # as decoder=nvjpeg silences it: nothing for its user to act on
                warnings.filterwarnings("ignore", TORCHVISION_DEPRECATION, DeprecationWarning)
                decoded = timed_decode(decode, encoded, device, 1)[0]  # the first call sets nvJPEG up: not timed
                seconds = timed_decode(decode, encoded, device, repeats)[1]
        except RuntimeError as err:
            rows.append({**row, "status": f"failed: {str(err).strip().splitlines()[0]}"})
            continue
        differences = [(image.cpu().int() - pillow.int()).abs() for image, pillow in zip(decoded, reference)]
        mean = sum(float(difference.float().mean()) for difference in differences) / len(differences)
        largest = max(int(difference.max()) for difference in differences)
        rows.append({**row, "images_per_s": round(len(files) * repeats / seconds, 1),
                     "vs_pillow": f"mean {mean:.3f}, max {largest}",
                     "status": "ok" if mean <= PIXEL_TOLERANCE else
                     f"failed: its pixels differ from Pillow's by {mean:.2f} levels on average, above "
                     f"{PIXEL_TOLERANCE}"})
    return rows


def timed_decode(decode, encoded: list[torch.Tensor], device: torch.device,
                 calls: int) -> tuple[list[torch.Tensor], float]:
    """The last call's images, and the seconds `calls` batched calls took, each waited for on the device."""
    start = time.perf_counter()
    for _ in range(calls):
        decoded = decode(encoded, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return decoded, time.perf_counter() - start
