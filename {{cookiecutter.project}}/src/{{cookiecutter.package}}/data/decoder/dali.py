"""`decoder=dali`: NVIDIA DALI decodes, crops (ROI decode: only the crop's part of the JPEG) and flips whole batches.

Pick it on GPUs when the CPU cannot keep up: the `mixed` backend decodes with nvJPEG (and the A100/H100
hardware JPEG decoder where present). `decoder.on_cpu=true` runs the same pipeline on DALI's CPU threads.
Workers read bytes and pick crops with the same geometry as every other decoder, so the data set,
sampler, skip policy and prefetchers are shared.
"""
import os

import numpy as np
import torch
from nvidia.dali import Pipeline, fn, types

from .batch import BatchDecoder, Encoded


class DaliDecoder(BatchDecoder):
    def __init__(self, batch_size: int, threads: int, on_cpu: bool = False):
        super().__init__(on_cpu)
        self.batch_size, self.threads = batch_size, threads
        self.pipeline = None  # built on first use, in the training process, for the crop size it is given
        self.copied = None  # on CUDA: an event after the last copy out of the pipeline's output

    def build(self, device: torch.device, size: int) -> Pipeline:
        # On the CPU, DALI's threads are the decoders: more of them than cores only take turns, and a batch waits
        # for its slowest thread.
        threads = min(self.threads, len(os.sched_getaffinity(0))) if self.on_cpu else self.threads
        pipeline = Pipeline(batch_size=self.batch_size, num_threads=threads,
                            device_id=None if self.on_cpu else device.index or 0, exec_async=False,
                            exec_pipelined=False, prefetch_queue_depth=1)
        with pipeline:
            jpegs = fn.external_source(name="jpegs", dtype=types.UINT8)
            anchors = fn.external_source(name="anchors", dtype=types.FLOAT)
            shapes = fn.external_source(name="shapes", dtype=types.FLOAT)
            mirror = fn.external_source(name="mirror", dtype=types.INT32)
            images = fn.decoders.image_slice(jpegs, anchors, shapes, device="cpu" if self.on_cpu else "mixed",
                                             output_type=types.RGB, adjust_orientation=False,
                                             normalized_anchor=False, normalized_shape=False)
            images = fn.resize(images, resize_x=size, resize_y=size, antialias=True)
            images = fn.flip(images, horizontal=mirror)
            pipeline.set_outputs(fn.transpose(images, perm=[2, 0, 1]))
        pipeline.build()
        return pipeline

    def decode_crops(self, encoded: list[Encoded], device: torch.device, non_blocking: bool) -> torch.Tensor:
        size = encoded[0].size
        if self.pipeline is None:
            self.pipeline = self.build(device, size)
        boxes = np.array([item.box for item in encoded], np.float32)  # left, top, right, bottom
        # One array per input, the batch its first dimension: 3 ms a batch of 64 where a list of arrays took 5 to 11.
        self.pipeline.feed_input("jpegs", [item.data.numpy() for item in encoded])
        self.pipeline.feed_input("anchors", np.ascontiguousarray(boxes[:, :2]))
        self.pipeline.feed_input("shapes", boxes[:, 2:] - boxes[:, :2])
        self.pipeline.feed_input("mirror", np.array([item.flip for item in encoded], np.int32))
        # This executor (exec_async=False, exec_pipelined=False) writes each run's output over the last one's, and
        # the copy out of it is only queued on torch's stream: it must be done before the next run starts.
        if self.copied is not None:
            self.copied.synchronize()
        (crops,) = self.pipeline.run()
        if self.on_cpu:  # np.array copies: DALI's CPU output is a view of the buffer the next run overwrites
            return torch.from_numpy(np.array(crops.as_tensor())).to(device, non_blocking=non_blocking)
        from nvidia.dali.plugin.pytorch import feed_ndarray

        stream = torch.cuda.current_stream(device)
        batch = torch.empty((len(encoded), 3, size, size), dtype=torch.uint8, device=device)
        feed_ndarray(crops.as_tensor(), batch, cuda_stream=stream)
        self.copied = stream.record_event()
        return batch
