"""Convert an ImageNet-style tree into a packed format, once, offline.

    python -m {{ cookiecutter.package }}.pack data.root=/data/imagenet format=lmdb pack.out=/data/imagenet-lmdb
    python -m {{ cookiecutter.package }}.pack data.root=/data/imagenet format=tensor pack.short_side=256 pack.out=/data/in-256
    python -m {{ cookiecutter.package }}.pack data.root=/data/imagenet format=litdata pack.out=s3://bucket/imagenet

The pack is written to a temporary folder beside pack.out and renamed when every file and pack.json are
complete, so an interrupted or failed pack leaves nothing that looks valid. An S3 pack is written locally,
then uploaded with pack.json last.
"""
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import options
from .core import failures
from .core.config import build
from .core.errors import ConfigError
from .tools.pack import pack

log = logging.getLogger(__name__)


def pack_command(cfg: DictConfig) -> dict:
    options.check(cfg)
    source = build(cfg.data)
    if source.root is None:
        raise ConfigError("pass data.root=SRC, the tree with train/ and val/ to pack")
    out = cfg.pack.out if str(cfg.pack.out).startswith("s3://") else Path(cfg.pack.out).expanduser()
    return pack(source.root, HydraConfig.get().runtime.choices["format"], out, cfg.pack.short_side, cfg.pack.quality,
                cfg.pack.workers, cfg.pack.overwrite, source.on_error, cfg.pack.chunk_mb, cfg.format.get("endpoint_url"))


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="pack")
def main(cfg: DictConfig) -> None:
    report = failures.one_line(lambda: pack_command(cfg))
    log.info("packed %d images (%d left out as unreadable) into %s: %.1f MB from %.1f MB, %.1f s, %.0f images/s",
             report["images"], report["skipped"], report["out"], report["packed_mb"], report["source_mb"],
             report["seconds"], report["images_per_s"])


if __name__ == "__main__":
    main()
