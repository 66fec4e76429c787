"""What an option of each kind must do. Read this package first: this page, then data.py and loop.py.

Every option is one YAML file, conf/<group>/<option>.yaml, and one small module. The generic code (the
loader assembly, the loop, the report, the tools) sees only the contracts below, and asks an option's facts
(options.py) what it can do; it never compares an option's name.

| group        | contract                         | the options                               |
|--------------|----------------------------------|-------------------------------------------|
| `format`     | `Format`: both splits' `Stores`  | data/format/<option>.py                   |
| `decoder`    | `Decoder`                        | data/decoder/<option>.py                  |
| `staging`    | `Staging`                        | data/staging.py                           |
| `order`      | `Order`                          | data/order.py                             |
| `augment`    | `Augment`                        | data/augment.py                           |
| `prefetcher` | `Prefetcher`                     | data/prefetcher.py                        |
| `logger`     | `Logger`                         | loop/logger.py                            |
| `profiler`   | `Profiler`                       | loop/profiler.py                          |
| `schedule`   | `Schedule`                       | loop/schedule.py                          |
| `model`      | `Network`                        | loop/model/<option>.py                    |

Everything a checkpoint holds is `Stateful`: the run saves a dict of such parts (loop/run.py: `Run.parts`).

A format that shards, shuffles and keeps its own place in the stream (litdata) also brings its training
loader, a `ResumableLoader`, as the loader assembly's own is (data/loaders.py).

Whatever the options, a batch reaching the training step is (normalised float images on the device,
labels): workers produce uint8 HWC crops (or encoded bytes, for GPU decoders) and the device does the rest.
"""
from .data import (Augment, Batch, Box, Crop, Decoder, EpochOrder, Format, Layout, Order, Prefetcher, ResumableLoader,
                   Run, Staging, Store, Stores, Trace, Uploader)
from .loop import (Axis, Exporter, Logger, Network, Outcome, Preprocessing, Pretrained, Profiler, Schedule,
                   Stateful)

__all__ = ["Augment", "Axis", "Batch", "Box", "Crop", "Decoder", "EpochOrder", "Exporter", "Format", "Layout",
           "Logger", "Network", "Order", "Outcome", "Prefetcher", "Preprocessing", "Pretrained", "Profiler",
           "ResumableLoader", "Run", "Schedule", "Staging", "Stateful", "Store", "Stores", "Trace", "Uploader"]
