"""Which data options fit together, asked of their facts before anything is opened (`check_fit`) and of the stores
once they are (`check_order`): each misfit refused in one line naming the options and what to pick instead."""
import logging

from omegaconf import DictConfig, OmegaConf, open_dict

from .. import options
from ..contracts import Stores
from ..core.errors import ConfigError
from .format.locations import is_address

log = logging.getLogger(__name__)


def check_order(stores: Stores, order: DictConfig) -> None:
    """Refuse, in one line, an order that reads records one at a time from a store that cannot read one alone."""
    if stores.train.single_read and not options.facts_of(order).in_runs:
        raise ConfigError(f"{stores.train.single_read}, and order={options.name_of('order', order)} reads one image at "
                          f"a time: pass order={options.only('order', 'in_runs')}, which reads a run of consecutive "
                          "records at once (order.block: a multiple of the rows a read takes wastes none)")


def usable_decoder(decoder: DictConfig) -> None:
    """Refuse, in one line, a CPU decoder that is not installed, naming the fastest one that is. One that no one picked
    (the default decoder=turbojpeg, where it has no wheel: Linux on Arm) gives way instead, with one warning: `decoder`
    then holds the fastest CPU decoder installed here."""
    decoding, named = options.facts_of(decoder), f"decoder={options.name_of('decoder', decoder)}"
    if decoding.decode_us and (missing := decoding.missing()):
        if not options.picked_by_default("decoder"):
            raise ConfigError(options.unavailable("decoder", decoder))
        fastest = options.fastest_cpu_decoder()
        log.warning("%s, the default, cannot run here (%s): decoding with decoder=%s, the fastest CPU decoder "
                    "installed here", named, missing, fastest)
        with open_dict(decoder):
            for key in list(decoder):
                del decoder[key]
            decoder.merge_with(OmegaConf.load(options.CONF / "decoder" / f"{fastest}.yaml"))


def check_fit(format: DictConfig, staging: DictConfig, decoder: DictConfig, order: DictConfig,
              augment: DictConfig | None = None) -> None:
    """Refuse, in one line, a CPU decoder that is not installed (or give way to the fastest one that is, see
    `usable_decoder`), a decoder that does not fit what the format stores, a staging with nothing to copy, an order
    that reads runs of records from a format that cannot, and a staging that makes the batches on the device from
    encoded files, or under an augmentation policy that runs in the loader's workers."""
    usable_decoder(decoder)
    stored, decoding = options.facts_of(format), options.facts_of(decoder)
    named = {group: f"{group}={options.name_of(group, node)}"
              for group, node in (("format", format), ("staging", staging), ("decoder", decoder), ("order", order))}
    if options.facts_of(order).in_runs and not stored.reads_runs:
        raise ConfigError(f"{named['order']} reads runs of consecutive records at once, which {named['format']} "
                          f"cannot: pick {' or '.join('format=' + name for name in options.having('format', 'reads_runs'))}"
                          f" (written by pack), or order={options.default('order')}")
    if stored.holds_pixels and not decoding.takes_pixels:
        raise ConfigError(f"{named['format']} stores decoded pixels, so there is nothing to decode: pass "
                          f"decoder={options.only('decoder', 'takes_pixels')}")
    if decoding.takes_pixels and not stored.holds_pixels:
        raise ConfigError(f"{named['decoder']} is for formats that store decoded pixels "
                          f"({', '.join('format=' + name for name in options.having('format', 'holds_pixels'))}), "
                          f"and {named['format']} stores encoded files: pick a decoder, such as "
                          f"decoder={options.fastest_cpu_decoder()}")
    if stored.streams and options.facts_of(staging).copies_to_ram:
        raise ConfigError(f"{named['staging']} has nothing to copy: {named['format']} {stored.streams}")
    if options.facts_of(staging).on_device:
        if not stored.holds_pixels:
            raise ConfigError(f"{named['staging']} crops decoded pixels on the device, and {named['format']} stores "
                              f"encoded files: pack them with format={options.only('format', 'holds_pixels')} "
                              f"pack.short_side=<side> and train from that, or pick staging={options.default('staging')}")
        if augment is not None and (policy := options.name_of("augment", augment)) != options.default("augment"):
            raise ConfigError(f"augment={policy} changes each crop in the loader's workers, which {named['staging']} "
                              f"has none of: pass augment={options.default('augment')}, or "
                              f"staging={options.default('staging')}")
    path = format.get("path")
    if stored.remote and isinstance(path, str) and is_address(path) and options.facts_of(staging).copies_to_ram:
        raise ConfigError(f"{named['staging']} copies local files, and format.path={path} is remote: drop the "
                          "staging option, or copy the files to a local folder and stage that")
