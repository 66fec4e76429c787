"""A zoo of the web's JPEGs, written here byte by byte: the oddities a scraped image set holds, which every decoder and
every format is tested against (test_zoo.py). What Pillow makes of each file is the reference: the one a decoder must
give, whether the file is readable and, where it is, its pixels within JPEG tolerance.
"""
import io
import struct
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageCms, ImageOps

from {{ cookiecutter.package }}.data.decoder import DECODE_ERRORS

from helpers.images import encoded, photo
from helpers.paths import DATA

WIDTH, HEIGHT = 160, 120  # small, so that the whole zoo decodes in milliseconds


def pillow_reads(data: bytes) -> np.ndarray | None:
    """Pillow's verdict: the pixels `Image.open(...).convert("RGB")` gives, or None where it refuses the file. It runs
    with whatever the project sets, which today is nothing: truncated files (ImageFile.LOAD_TRUNCATED_IMAGES) and images
    over twice Image.MAX_IMAGE_PIXELS (a decompression bomb) are refused."""
    try:
        with warnings.catch_warnings():  # what Pillow warns of (an image just below its size limit, corrupt EXIF)
            warnings.simplefilter("ignore")  # is not its verdict
            return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    except DECODE_ERRORS:
        return None


def before_end(data: bytes, extra: bytes) -> bytes:
    """`extra` between the last scan and the end-of-image marker."""
    return data[:-2] + extra + data[-2:]


def before_marker(data: bytes, marker: bytes, extra: bytes) -> bytes:
    """`extra` just before the first segment `marker` starts."""
    at = data.index(marker)
    return data[:at] + extra + data[at:]


def segment_length(data: bytes, marker: bytes, change: int) -> bytes:
    """The length of the first segment `marker` off by `change`: the walk through the header loses its way there."""
    at = data.index(marker) + 2
    return data[:at] + struct.pack(">H", int.from_bytes(data[at:at + 2], "big") + change) + data[at + 2:]


def frame_size(data: bytes, width: int, height: int) -> bytes:
    """A baseline JPEG whose frame header (SOF0) claims width x height; the scans stay as they were."""
    at = data.index(b"\xff\xc0") + 5
    return data[:at] + struct.pack(">HH", height, width) + data[at + 4:]


def last_scan_cut(data: bytes) -> bytes:
    """A progressive JPEG cut half-way through its last scan, as an interrupted download leaves it."""
    last = data.rindex(b"\xff\xda")
    return data[:last + (len(data) - last) // 2]


def ycck(image: Image.Image) -> bytes:
    """`image` as a YCCK JPEG: four components, the first three YCbCr of the inverted image and K, which an Adobe APP14
    segment with transform 2 asks decoders to convert back. Pillow writes only Adobe's CMYK (transform 0), as it is
    given: the components are written inverted, as Adobe's CMYK is, and the transform byte is patched."""
    components = np.concatenate([np.asarray(ImageOps.invert(image).convert("YCbCr")),
                                 np.full((image.height, image.width, 1), 255, np.uint8)], axis=2)  # K: no black ink
    data = encoded(Image.fromarray(255 - components, "CMYK"))
    transform = data.index(b"Adobe") + 11  # after "Adobe", its version and its two flag words
    assert data[transform] == 0, "Pillow's Adobe segment is not the CMYK one this patch expects"
    return data[:transform] + b"\x02" + data[transform + 1:]


def exif(order: bytes, entries: list[tuple[int, int, bytes]], thumbnail: bytes | None = None) -> bytes:
    """An EXIF block ("Exif\\0\\0", then a TIFF structure in byte order b"II" or b"MM"): IFD0 holds `entries` (tag,
    type, value packed in 4 bytes), and IFD1, where there is a `thumbnail`, points to that JPEG, stored after it."""
    endian = "<" if order == b"II" else ">"
    ifd0 = struct.pack(endian + "H", len(entries)) + b"".join(struct.pack(endian + "HHI", tag, kind, 1) + value
                                                              for tag, kind, value in entries)
    ifd1_at = 8 + len(ifd0) + 4 if thumbnail else 0
    tiff = order + struct.pack(endian + "HI", 42, 8) + ifd0 + struct.pack(endian + "I", ifd1_at)
    if thumbnail:
        thumbnail_at = ifd1_at + 2 + 2 * 12 + 4
        tiff += struct.pack(endian + "HHHIIHHII", 2, 0x0201, 4, 1, thumbnail_at, 0x0202, 4, 1, len(thumbnail)) \
            + struct.pack(endian + "I", 0) + thumbnail  # JPEGInterchangeFormat and its length; no IFD after
    return b"Exif\0\0" + tiff


def orientation(order: bytes, value: int, kind: int = 3) -> tuple[int, int, bytes]:
    """The orientation tag (0x0112) as a SHORT (3), as the standard has it, or as a LONG (4)."""
    endian = "<" if order == b"II" else ">"
    return 0x0112, kind, struct.pack(endian + "HH", value, 0) if kind == 3 else struct.pack(endian + "I", value)


def app1(payload: bytes) -> bytes:
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def after_start(data: bytes, segment: bytes) -> bytes:
    """`segment` right after the start-of-image marker."""
    return data[:2] + segment + data[2:]


def two_segment_icc() -> bytes:
    """The sRGB profile, padded past what one APP2 segment holds (65,519 bytes), its header's size field matching."""
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    padded = srgb + bytes(70_000)
    return struct.pack(">I", len(padded)) + padded[4:]


def plain(seed: int = 0, **options) -> bytes:
    return encoded(photo(WIDTH, HEIGHT, seed=seed), **options)


XMP = b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta xmlns:x='adobe:ns:meta/'/>"

# Each file with the oddity it brings. The order matters: the files after `bogus_marker_length` show that a decoder
# that kept per-thread state through that failure still decodes good files itself.
ZOO = {
    "baseline": plain(),
    # libjpeg's Huffman decoder reads a few bytes ahead of the last scan, so a lone extra byte vanishes into it;
    # sixteen leave about ten: "Corrupt JPEG data: 9 extraneous bytes before marker 0xd9", a warning once every pixel
    # is decoded.
    "extraneous_bytes_before_end": before_end(plain(1), bytes(16)),
    "junk_between_header_segments": before_marker(plain(2), b"\xff\xdb", b"\x00"),  # a warning while the header is read
    "bogus_marker_length": segment_length(plain(3), b"\xff\xc0", -1),  # "Bogus marker length": libjpeg gives up
    "after_a_bad_header": plain(4),
    "restart_markers_every_3_mcus": plain(5, restart_marker_blocks=3),
    "restart_markers_every_row": plain(6, restart_marker_rows=1),
    "progressive": plain(7, progressive=True),
    "progressive_last_scan_cut": last_scan_cut(plain(8, progressive=True)),
    "end_marker_missing": plain(9)[:-2],  # Pillow reads this one, though not every file cut there
    "baseline_cut_short": plain(25)[:len(plain(25)) * 3 // 4],  # its top half all there, its bottom rows not
    "cmyk": encoded(photo(WIDTH, HEIGHT, "CMYK", seed=10)),
    "ycck": ycck(photo(WIDTH, HEIGHT, seed=11)),
    "grayscale": encoded(photo(WIDTH, HEIGHT, "L", seed=12)),
    # Arithmetic coding: written by libjpeg-turbo's `cjpeg -arithmetic` from photo(64, 48).
    "arithmetic": (DATA / "arithmetic.jpg").read_bytes(),
    # 12-bit samples, which Pillow does not read: written by tj3Compress12 of the libjpeg-turbo 3 that the turbojpeg
    # wheel bundles, from photo(64, 48)'s pixels times 16, quality 90, 4:2:0.
    "twelve_bit": (DATA / "twelve_bit.jpg").read_bytes(),
    "exif_rotated_little_endian": plain(13, exif=exif(b"II", [orientation(b"II", 3)])),
    "exif_rotated_big_endian": plain(14, exif=exif(b"MM", [orientation(b"MM", 8)])),
    "exif_with_thumbnail": plain(15, exif=exif(b"MM", [orientation(b"MM", 6)], encoded(photo(32, 24)))),
    "exif_broken": plain(16, exif=b"Exif\0\0MM\0\x2a\xff\xff\xff\xf0" + bytes(8)),  # IFD0 past the segment's end
    # Read by Pillow as orientation 6; a reader that takes the tag's first two bytes as a SHORT sees 0.
    "exif_orientation_as_long": plain(17, exif=exif(b"MM", [orientation(b"MM", 6, kind=4)])),
    # An XMP packet in the first APP1 segment, EXIF's in the second: a reader of the first APP1 alone misses EXIF.
    "xmp_before_exif": after_start(plain(18, exif=exif(b"II", [orientation(b"II", 6)])), app1(XMP)),
    "icc_profile": plain(19, icc_profile=ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()),
    "icc_profile_in_two_segments": plain(20, icc_profile=two_segment_icc()),
    "trailing_garbage": plain(21) + np.random.default_rng(0).integers(0, 256, 3000, np.uint8).tobytes(),
    # 60000 x 60000 claimed by 700 bytes: Pillow refuses it as a decompression bomb before allocating anything.
    "huge_header": frame_size(encoded(photo(16, 16)), 60000, 60000),
    "png": encoded(photo(WIDTH, HEIGHT, "RGBA", seed=22), "PNG"),
    "gif": encoded(photo(WIDTH, HEIGHT, seed=23).quantize(64), "GIF"),
    "webp": encoded(photo(WIDTH, HEIGHT, seed=24), "WEBP"),
}


def write_tree(root: Path) -> Path:
    """The zoo as a data set: train/<name>/<name>.JPEG and the same in val/, one class per file, so that a label says
    which file an image came from."""
    for split in ("train", "val"):
        for name, data in ZOO.items():
            (root / split / name).mkdir(parents=True)
            (root / split / name / f"{name}.JPEG").write_bytes(data)
    return root
