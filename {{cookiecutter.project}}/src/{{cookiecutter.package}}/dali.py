"""`decoder=dali`: NVIDIA DALI decodes, crops (ROI decode: only the crop's part of the JPEG) and flips whole batches.

Pick it on GPUs when the CPU cannot keep up: the `mixed` backend decodes with nvJPEG (and the A100/H100
hardware JPEG decoder where present). `decoder.device=cpu` runs the same pipeline on CPU threads.
Workers read bytes and pick crops with the same geometry as every other decoder, so the data set,
sampler, skip policy and prefetchers are shared. Needs: pip install -e '.[dali]'
"""
import numpy as np
import torch

from .config import ConfigError, optional_import
from .decoder import Decoder, NvjpegDecoder


class DaliDecoder(NvjpegDecoder):
    def __init__(self, size: int, batch_size: int, threads: int, device: str):
        if device not in ("gpu", "cpu"):
            raise ConfigError(f"decoder.device={device!r}: pick gpu or cpu")
        super().__init__(size, decode_device="cuda" if device == "gpu" else "cpu")
        optional_import("nvidia.dali", "dali")
        self.batch_size, self.threads = batch_size, threads
        self.pipeline = None  # built on first use, in the training process

    def check_device(self, device: torch.device) -> None:
        if self.decode_device == "cuda" and device.type != "cuda":
            raise ConfigError("decoder=dali decodes on the GPU and this run has none: "
                              "pass decoder.device=cpu, or pick decoder=turbojpeg")

    def build(self, device: torch.device):
        from nvidia.dali import Pipeline, fn, types

        gpu = self.decode_device == "cuda"
        pipeline = Pipeline(batch_size=self.batch_size, num_threads=self.threads,
                            device_id=device.index or 0 if gpu else None, exec_async=False, exec_pipelined=False,
                            prefetch_queue_depth=1)
        with pipeline:
            jpegs = fn.external_source(name="jpegs", dtype=types.UINT8)
            anchors = fn.external_source(name="anchors", dtype=types.FLOAT)
            shapes = fn.external_source(name="shapes", dtype=types.FLOAT)
            mirror = fn.external_source(name="mirror", dtype=types.INT32)
            images = fn.decoders.image_slice(jpegs, anchors, shapes, device="mixed" if gpu else "cpu",
                                             output_type=types.RGB, adjust_orientation=False,
                                             normalized_anchor=False, normalized_shape=False)
            images = fn.resize(images, resize_x=self.size, resize_y=self.size, antialias=True)
            images = fn.flip(images, horizontal=mirror)
            pipeline.set_outputs(fn.transpose(images, perm=[2, 0, 1]))
        pipeline.build()
        return pipeline

    def decode_crops(self, encoded: list, device: torch.device, non_blocking: bool) -> list[torch.Tensor]:
        if self.pipeline is None:
            self.pipeline = self.build(device)
        boxes = [(left, top, right - left, bottom - top) for left, top, right, bottom in
                 (box.tolist() for _, box, _ in encoded)]
        self.pipeline.feed_input("jpegs", [data.numpy() for data, _, _ in encoded])
        self.pipeline.feed_input("anchors", [np.array(box[:2], np.float32) for box in boxes])
        self.pipeline.feed_input("shapes", [np.array(box[2:], np.float32) for box in boxes])
        self.pipeline.feed_input("mirror", [np.array(int(flip), np.int32) for _, _, flip in encoded])
        (crops,) = self.pipeline.run()
        if self.decode_device == "cuda":
            from nvidia.dali.plugin.pytorch import feed_ndarray

            batch = torch.empty((len(encoded), 3, self.size, self.size), dtype=torch.uint8, device=device)
            feed_ndarray(crops.as_tensor(), batch, cuda_stream=torch.cuda.current_stream(device))
        else:
            batch = torch.from_numpy(np.array(crops.as_tensor())).to(device, non_blocking=non_blocking)
        return list(batch)


def dali(size: int, batch_size: int, threads: int, device: str) -> Decoder:
    return DaliDecoder(size, batch_size, threads, device)
