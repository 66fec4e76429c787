"""`decoder=turbojpeg`: libjpeg-turbo's TurboJPEG 3 API, decoding only the crop's region of a JPEG at the largest
DCT scale (1, 1/2, 1/4, 1/8) that still covers the output size.

A region decode (tj3SetCroppingRegion) skips the rows above the crop without their inverse DCT, stops after the
crop's last row, and runs the inverse DCT, upsampling and colour conversion only on the MCU columns the crop
spans: a random-resized crop keeps about half of an image on average, so about half of the work is left out.
No Python binding on PyPI exposes it: simplejpeg and imagecodecs decode whole images; PyTurboJPEG 2 does not set
a cropping region for decoding and loads the system's libturbojpeg, which is 2.x on Debian 12 and Ubuntu 24.04.
The `turbojpeg` wheel bundles libturbojpeg 3 (TurboJPEG 3 API); the few calls below reach it through ctypes.

TurboJPEG reads baseline, progressive and arithmetic-coded 8-bit YCbCr or grayscale JPEGs; Pillow takes anything
else (PNG under a .JPEG name, CMYK, 12-bit, a JPEG cut short), so every file of ImageNet still decodes.
"""
import ctypes
import functools
import importlib.metadata
import math
import threading

import numpy as np

from ... import options
from ...contracts import Box
from . import CpuDecoder, dct_scale, scaled
from .jpeg import cut_short, pil_size

INIT_DECOMPRESS, PIXEL_RGB = 1, 0  # TJINIT_DECOMPRESS, TJPF_RGB
WARNING = 0  # TJERR_WARNING, from tj3GetErrorCode: the call did its work, where TJERR_FATAL (1) says it gave up
SUBSAMPLING, WIDTH, HEIGHT, PRECISION, COLOURSPACE = 4, 5, 6, 7, 8  # TJPARAM_* read after tj3DecompressHeader
READ_COLOURSPACES = {1, 2}  # TJCS_YCbCr, TJCS_GRAY
MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)  # pixels, by TJSAMP_444, 422, 420, GRAY, 440, 411, 441; -1 is unknown


class Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class Scale(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


@functools.cache
def library() -> ctypes.CDLL:
    """The libturbojpeg 3 that the `turbojpeg` wheel bundles (this option's facts name both, and building the decoder
    checked they are here), with the signatures of the calls made here."""
    facts = options.facts("decoder", __name__.rsplit(".", 1)[-1])
    path = next(file for file in importlib.metadata.files(facts.distribution) if facts.bundles in file.name)
    lib = ctypes.CDLL(str(path.locate()))
    handle, data, size, status = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.tj3Init.restype, lib.tj3Init.argtypes = handle, [status]
    lib.tj3DecompressHeader.argtypes = [handle, data, size]
    lib.tj3Get.argtypes = [handle, status]
    lib.tj3SetScalingFactor.argtypes = [handle, Scale]
    lib.tj3SetCroppingRegion.argtypes = [handle, Region]
    lib.tj3Decompress8.argtypes = [handle, data, size, data, status, status]
    lib.tj3GetErrorStr.restype, lib.tj3GetErrorStr.argtypes = ctypes.c_char_p, [handle]
    lib.tj3GetErrorCode.argtypes = [handle]
    lib.tj3Destroy.restype, lib.tj3Destroy.argtypes = None, [handle]
    return lib


class TurboJpegDecoder(CpuDecoder):
    def __init__(self):
        self.local = threading.local()  # a TurboJPEG handle holds one decode's state: one per thread

    def __getstate__(self) -> dict:
        return {}  # a handle is a pointer into this process: workers started by spawn make their own

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def call(self, function: str, *args) -> int:
        """`function` on this thread's handle; a failure is a ValueError.

        A warning is not a failure: libjpeg warns of bytes it skipped ("extraneous bytes before marker 0xd9", once
        every pixel is decoded; junk between header segments), and Pillow, which ignores its warnings, reads such files.
        A JPEG cut short, whose warning would hide grey rows, never gets here (`reads`). A failed call leaves the handle
        in the middle of a file (a header read that stopped at a bogus marker length fails every later file on it), so
        the thread gets a new one."""
        lib = library()
        if not hasattr(self.local, "handle"):
            self.local.handle = lib.tj3Init(INIT_DECOMPRESS)
        result = getattr(lib, function)(self.local.handle, *args)
        if result == -1 and lib.tj3GetErrorCode(self.local.handle) != WARNING:
            message = lib.tj3GetErrorStr(self.local.handle).decode(errors="replace")
            lib.tj3Destroy(self.local.handle)
            del self.local.handle
            self.local.data = None  # the header read for the next call to reuse was on that handle
            raise ValueError(message)
        return result

    def header(self, data: bytes) -> tuple[np.ndarray, dict[int, int]]:
        """The file as a buffer TurboJPEG reads, and its header's width, height, subsampling, precision, colourspace.

        A worker asks for the size, whether the file is read here and its region, one after the other: the header is
        read once per file, and this thread's handle keeps that file's header for the decode that follows."""
        if getattr(self.local, "data", None) is data:  # `local` holds `data`, so no other object can have its id
            return self.local.parsed
        self.local.data = None  # until the header below has been read
        buffer = np.frombuffer(data, np.uint8)
        self.call("tj3DecompressHeader", buffer.ctypes.data, buffer.size)
        # Not through `call`: -1 is a value here (TJSAMP_UNKNOWN, a sampling TurboJPEG decodes but cannot crop).
        self.local.parsed = buffer, {key: library().tj3Get(self.local.handle, key)
                                     for key in (SUBSAMPLING, WIDTH, HEIGHT, PRECISION, COLOURSPACE)}
        self.local.data = data
        return self.local.parsed

    def image_size(self, data: bytes) -> tuple[int, int]:
        try:
            _, header = self.header(data)
            return header[WIDTH], header[HEIGHT]
        except ValueError:
            return pil_size(data)

    def reads(self, data: bytes) -> bool:
        try:
            _, header = self.header(data)
        except ValueError:
            return False
        return header[COLOURSPACE] in READ_COLOURSPACES and header[PRECISION] == 8 and not cut_short(data)

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        buffer, header = self.header(data)
        denominator = dct_scale(shrink)
        return self.decompress(buffer, denominator, Region(0, 0, math.ceil(header[WIDTH] / denominator),
                                                           math.ceil(header[HEIGHT] / denominator)), whole=True)

    def decode_box(self, data: bytes, size: tuple[int, int], box: Box, shrink: float) -> tuple[np.ndarray, Box]:
        buffer, header = self.header(data)
        denominator = dct_scale(shrink)
        width, height = math.ceil(size[0] / denominator), math.ceil(size[1] / denominator)  # as TurboJPEG scales
        if header[SUBSAMPLING] not in range(len(MCU_WIDTH)):  # a sampling TurboJPEG cannot crop: the whole image
            return scaled(self.decompress(buffer, denominator, Region(0, 0, width, height), whole=True), size, box)
        left, top = box[0] * width / size[0], box[1] * height / size[1]
        right, bottom = box[2] * width / size[0], box[3] * height / size[1]
        # A region starts on a scaled MCU column; both offsets are even, so that pixel_box's round-half-to-even
        # picks the same pixels from the region as from the whole image.
        x_step = max(2, math.ceil(MCU_WIDTH[header[SUBSAMPLING]] / denominator))
        x, y = int(left) // x_step * x_step, int(top) // 2 * 2
        region = Region(x, y, max(1, min(math.ceil(right), width) - x), max(1, min(math.ceil(bottom), height) - y))
        return self.decompress(buffer, denominator, region), (left - x, top - y, right - x, bottom - y)

    def decompress(self, buffer: np.ndarray, denominator: int, region: Region, whole: bool = False) -> np.ndarray:
        """`region`, in scaled pixels, of the JPEG whose header was read last, decoded at 1/denominator scale;
        `whole`: the region is the whole image, which TurboJPEG decodes without cropping."""
        self.call("tj3SetScalingFactor", Scale(1, denominator))
        self.call("tj3SetCroppingRegion", Region(0, 0, 0, 0) if whole else region)
        image = np.empty((region.h, region.w, 3), np.uint8)
        self.call("tj3Decompress8", buffer.ctypes.data, buffer.size, image.ctypes.data, region.w * 3, PIXEL_RGB)
        return image
