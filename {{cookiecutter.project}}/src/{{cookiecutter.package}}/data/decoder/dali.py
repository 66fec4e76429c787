"""`decoder=dali`: NVIDIA DALI decodes, crops (ROI decode: only the crop's part of the JPEG) and flips whole batches.

Pick it on GPUs when the CPU cannot keep up: the `mixed` backend decodes with nvJPEG (and the A100/H100
hardware JPEG decoder where present). `decoder.on_cpu=true` runs the same pipeline on DALI's CPU threads.
Workers read bytes and pick crops with the same geometry as every other decoder, so the data set,
sampler, skip policy and prefetchers are shared. DALI's executor runs beside the host: each batch is started
before the one before it is handed over, so DALI decodes while the host waits for the loader and trains.
"""
import contextlib
import os
from collections import deque
from collections.abc import Callable

import numpy as np
import torch
from nvidia.dali import Pipeline, fn, types

from .batch import BatchDecoder, Encoded


class DaliDecoder(BatchDecoder):
    queued_batches = 1  # in DALI's executor, while the host takes the one before it

    def __init__(self, batch_size: int, threads: int, on_cpu: bool = False):
        super().__init__(on_cpu)
        self.batch_size, self.threads = batch_size, threads
        # By crop size, built on first use in the training process: one for validation, and one per size of a
        # progressive schedule. Each with a token per batch started and not yet taken out, in the order it runs them.
        self.pipelines: dict[int, tuple[Pipeline, deque]] = {}

    def build(self, device: torch.device, size: int) -> Pipeline:
        # On the CPU, DALI's threads are the decoders: more of them than cores only take turns, and a batch waits
        # for its slowest thread.
        threads = min(self.threads, len(os.sched_getaffinity(0))) if self.on_cpu else self.threads
        # DALI's default executor (asynchronous, pipelined, dynamic), queueing runs as they are fed: its outputs are
        # each run's own memory, never written over by a later run. A deeper prefetch queue would run ahead of
        # what was fed.
        pipeline = Pipeline(batch_size=self.batch_size, num_threads=threads,
                            device_id=None if self.on_cpu else device.index or 0, prefetch_queue_depth=1)
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

    def start(self, encoded: list[Encoded], device: torch.device, non_blocking: bool) -> Callable[[], torch.Tensor]:
        size = encoded[0].size
        if size not in self.pipelines:
            self.pipelines[size] = self.build(device, size), deque()
        pipeline, running = self.pipelines[size]
        boxes = np.array([item.box for item in encoded], np.float32)  # left, top, right, bottom
        # One array per input, the batch its first dimension: 3 ms a batch of 64 where a list of arrays took 5 to 11.
        pipeline.feed_input("jpegs", [item.data for item in encoded])
        pipeline.feed_input("anchors", np.ascontiguousarray(boxes[:, :2]))
        pipeline.feed_input("shapes", boxes[:, 2:] - boxes[:, :2])
        pipeline.feed_input("mirror", np.array([item.flip for item in encoded], np.int32))
        pipeline.schedule_run()
        token = object()
        running.append(token)

        def crops() -> torch.Tensor:
            # DALI hands outputs back in the order it ran them. A batch started by a pass the training loop left
            # early (max_steps, limit_val_batches) is never asked for: its output is dropped here, so that no batch
            # is ever paired with another's labels.
            stream = None if self.on_cpu else torch.cuda.current_stream(device)
            while running.popleft() is not token:
                with contextlib.suppress(RuntimeError):  # a batch nobody takes fails nobody's pass
                    pipeline.outputs(cuda_stream=stream)
            (output,) = pipeline.outputs(cuda_stream=stream)
            if self.on_cpu:  # the output's own memory, which no later run writes to: no copy
                return torch.from_dlpack(output.as_tensor()).to(device, non_blocking=non_blocking)
            from nvidia.dali.plugin.pytorch import feed_ndarray

            batch = torch.empty((len(encoded), 3, size, size), dtype=torch.uint8, device=device)
            feed_ndarray(output.as_tensor(), batch, cuda_stream=stream)  # queued on the stream the output is bound to
            return batch
        return crops
