"""What a file's header says, read without decoding it: its size, how a JPEG is coded, where it ends; and a JPEG with
its APP1 segments hidden from a decoder that would turn the image by them."""
import io
from collections.abc import Iterator
from dataclasses import dataclass

from PIL import Image


def pil_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the header alone."""
    return Image.open(io.BytesIO(data)).size


# Start-of-frame markers: baseline, extended sequential and progressive Huffman coding. nvJPEG decodes these
# (and only in 8-bit precision); arithmetic coding (0xC9-0xCB), lossless (0xC3) and hierarchical frames it does not.
HUFFMAN_FRAMES = {0xC0, 0xC1, 0xC2}
START_OF_SCAN, APP1, APP15 = 0xDA, 0xE1, 0xEF


@dataclass(frozen=True)
class Frame:
    """A JPEG's frame header: how its scans are coded (the start-of-frame marker), its sample precision in bits, its
    size and its colour components (1 grey, 3 YCbCr or RGB, 4 CMYK or YCCK); and whether its header holds APP1
    segments (EXIF, XMP)."""
    marker: int
    precision: int
    width: int
    height: int
    components: int
    app1: bool

    @property
    def huffman_8bit(self) -> bool:
        """Huffman-coded with 8-bit samples: the kind GPU JPEG decoders take."""
        return self.marker in HUFFMAN_FRAMES and self.precision == 8

    @property
    def cmyk(self) -> bool:
        """Four components, which Pillow reads as Adobe's inverted CMYK and other libjpeg-based decoders the other
        way round."""
        return self.components == 4


def header_segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(marker, position, length) of each segment of a JPEG's header, in order, the first scan's (SOS) last; the walk
    stops short of it where it cannot follow the header (a segment length that leads it astray, stray bytes between
    segments, a header cut short)."""
    position = 2  # after SOI
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker == 0xFF:  # a fill byte
            position += 1
            continue
        length = int.from_bytes(data[position + 2:position + 4], "big")
        yield marker, position, length
        if marker == START_OF_SCAN:
            return
        position += 2 + length


def jpeg_frame(data: bytes) -> Frame | None:
    """The frame header of a JPEG, found by walking the header's segments up to the first scan; None for a file that
    is not a JPEG, or whose header the walk cannot follow to its first scan: whether libjpeg gets over that is for
    Pillow to judge, as it judges any file the other decoders do not take. Pillow's Image.open reads the same facts in
    80 us a photo, this walk in 5."""
    if data[:2] != b"\xff\xd8":
        return None
    frame, app1 = None, False
    for marker, position, length in header_segments(data):
        if marker == START_OF_SCAN:
            return Frame(*frame, app1) if frame else None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and frame is None:  # not DHT, JPG, DAC
            if position + 10 > len(data) or length != 8 + 3 * data[position + 9]:  # 3 bytes per component
                return None
            frame = (marker, data[position + 4], int.from_bytes(data[position + 7:position + 9], "big"),
                     int.from_bytes(data[position + 5:position + 7], "big"), data[position + 9])
        app1 = app1 or marker == APP1
    return None


def without_app1(data: bytes) -> bytearray:
    """A copy of a JPEG whose header's APP1 segments (EXIF, XMP) are marked APP15, which decoders skip unread; for a
    JPEG whose header the walk follows (`jpeg_frame`). TorchCodec turns an image by the EXIF orientation it reads from
    the first APP1 segment, its own way (an XMP packet there hides EXIF from it, a tag stored as a LONG reads as none),
    where no decoder here applies EXIF orientation: what it never sees, it cannot turn by."""
    copy = bytearray(data)
    for marker, position, _ in header_segments(data):
        if marker == APP1:
            copy[position + 1] = APP15
    return copy


def header_size(data: bytes, frame: Frame | None = None) -> tuple[int, int]:
    """(width, height): a JPEG's from its frame header (`frame`, where it was read already), anything else's (or a
    JPEG whose height comes later, in a DNL segment) from Pillow's reading of its header."""
    frame = frame or jpeg_frame(data)
    return (frame.width, frame.height) if frame and frame.width and frame.height else pil_size(data)


def reads_as_jpeg(data: bytes) -> bool:
    """A JPEG that libjpeg-turbo's other users read as Pillow does: not PNG under a .JPEG name, one whose header the
    walk follows (`jpeg_frame`), not Adobe's CMYK, not cut short."""
    frame = jpeg_frame(data)
    return frame is not None and not frame.cmyk and not cut_short(data)


def cut_short(data: bytes) -> bool:
    """A JPEG that stops before its end-of-image marker, as an interrupted download leaves it. Whether what is there is
    enough to decode is Pillow's verdict, file by file (it reads some that lack only the marker): libjpeg-turbo fills in
    what is missing with a warning, and a decode that stops at its crop's last row never meets the cut."""
    return data[:2] == b"\xff\xd8" and not data.endswith(b"\xff\xd9") and jpeg_end(data) is None


STANDALONE_MARKERS = {0x01, *range(0xD0, 0xDA)}  # TEM, RST0-7, SOI, EOI: markers with no length after them


def jpeg_end(data: bytes) -> int | None:
    """Where a JPEG's end-of-image marker ends, found by walking its segments and scans; None for a file that
    stops before one (truncated). Bytes after it (a phone's motion-photo video, a vendor's block) are not the
    image's: Pillow and libjpeg ignore them."""
    position = 2  # after SOI
    while True:
        position = data.find(b"\xff", position)
        while 0 <= position < len(data) - 1 and data[position + 1] == 0xFF:  # fill bytes before a marker
            position += 1
        if position < 0 or position + 1 >= len(data):
            return None
        marker, position = data[position + 1], position + 2
        if marker == 0xD9:
            return position
        if marker in STANDALONE_MARKERS or marker == 0x00:  # 0x00: a stuffed byte in a scan's data
            continue
        if position + 2 > len(data):
            return None
        position += int.from_bytes(data[position:position + 2], "big")  # a segment: its length counts itself
