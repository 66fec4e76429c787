"""`format=litdata`: LitData's chunks of encoded bytes, streamed from a local folder or `s3://bucket/prefix`.

LitData shards and shuffles the training split across processes and workers, downloads chunks ahead into
`format.cache_dir` on each node, and keeps the stream's place: a checkpoint holds LitData's own state for
the last trained batch, so a resumed run reads on from the next one. Validation reads every image once, by
index, through our shard of the split. Decoding, crops and the skip policy are those of every format.

A pack is a folder (or prefix) with `train/` and `val/`, each LitData's `index.json` and chunks, and our
`pack.json`, written last: a pack without it did not finish.
"""
import json
import logging
import multiprocessing
import weakref
from pathlib import Path

from ...contracts import Format, Store, Stores
from ...core.errors import ConfigError
from . import META, SPLITS, s3

log = logging.getLogger(__name__)

INDEX = "index.json"


def storage_options(endpoint_url: str | None) -> dict:
    """What LitData hands its S3 clients. Credentials stay in the usual AWS_* environment variables."""
    if not endpoint_url:
        return {}
    if endpoint_url.startswith("http://"):
        import litdata.streaming.downloader as downloader
        # LitData's obstore client refuses plain HTTP unless told; its boto3 client does not ask.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
        log.info("format.endpoint_url=%s is plain HTTP: allowed for LitData's S3 client", endpoint_url)
    return {"endpoint_url": endpoint_url}


def checked_meta(path: str, endpoint_url: str | None) -> dict:
    """pack.json, once every chunk that each split's index names is there at the size it gives."""
    try:
        files = s3.sizes_at(path, endpoint_url)
    except Exception as err:  # noqa: BLE001 - boto3 and the file system each fail their own way
        raise ConfigError(f"format.path={path} cannot be listed: {str(err).splitlines()[0]}") from None
    if not s3.is_remote(path) and Path(path).expanduser().is_file():
        raise ConfigError(f"format.path={path} is a file; pass the folder or s3:// prefix pack wrote (its pack.out, "
                          f"which holds {META})")
    if not files:
        raise ConfigError(f"format.path={path} is empty or does not exist; write it with "
                          "python -m {{ cookiecutter.package }}.pack format=litdata")
    if META not in files:
        raise ConfigError(f"{path} has no {META}: it is not a packed data set, or its pack did not finish; write it "
                          "with python -m {{ cookiecutter.package }}.pack format=litdata pack.out=<folder or s3://>")
    meta = json.loads(s3.read_text(path, META, endpoint_url))
    if meta.get("format") != "litdata":
        raise ConfigError(f"{path} holds format={meta.get('format')}, not format=litdata")
    for split in SPLITS:
        if f"{split}/{INDEX}" not in files:
            raise ConfigError(f"{path}/{split} has no {INDEX}: the pack is damaged; pack it again")
        for number, chunk in enumerate(json.loads(s3.read_text(path, f"{split}/{INDEX}", endpoint_url))["chunks"]):
            name, expected = f"{split}/{chunk['filename']}", chunk["chunk_bytes"]
            if files.get(name, 0) != expected:
                raise ConfigError(f"{path}/{name} has {files.get(name, 0)} bytes where {INDEX} says {expected}: "
                                  "truncated or missing; pack it again")
            if number == 0 or not s3.is_remote(path):  # on S3, a request a chunk: the first shows the layout
                check_header(path, name, chunk["chunk_size"], endpoint_url)
    return meta


def check_header(path: str, name: str, items: int, endpoint_url: str | None) -> None:
    """A chunk starts with its item count and its items' offsets (uint32): another file of the same size fails
    here, not in a worker, and so does a chunk whose images are not between those offsets. LitData's writer puts
    a dict of plain values in an Arrow table after the offsets instead, where pyarrow is installed (as packs before
    this one's tuples did), and its reader finds no bytes there when it reads from S3."""
    head = s3.read_head(path, name, 4 * (items + 2), endpoint_url)
    found = int.from_bytes(head[:4], "little")
    if found != items:
        raise ConfigError(f"{path}/{name} is not a readable litdata chunk: it says {found} images where {INDEX} "
                          f"says {items}; pack it again")
    first, last = (int.from_bytes(head[at:at + 4], "little") for at in (4, 4 * (items + 1)))
    if items and first == last and s3.is_remote(path):
        raise ConfigError(f"{path}/{name} holds its images in LitData's Arrow layout, which LitData cannot read "
                          "from S3; pack it again with python -m {{ cookiecutter.package }}.pack format=litdata")


def split_dataset_class():
    """StreamingDataset with our records, built on first use so that the module imports without the extra."""
    from litdata import StreamingDataset

    class Records(StreamingDataset):
        """One split's stream. While training, each streamed record goes through `images` (data.Images): the
        decoder's crop, seeded by (epoch, index) like every format's, and the skip policy."""
        images = None
        streaming = None  # the ChunkedIndex LitData's iteration asks for now, in this worker

        # Whole chunks, cached, for every read. LitData reads a sample asked for by position with one range
        # request (on_demand_bytes), and that request returns no bytes from a chunk in its Arrow layout, which
        # its writer picks where pyarrow is installed. Reads by position are validation's, in order, which
        # reads each chunk whole anyway, and the rare neighbour of an unreadable image.
        on_demand_bytes = property(lambda self: False, lambda self, value: None)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._on_demand_bytes = False  # what LitData's reader is built with
            # Persistent workers keep the copy of this object they started with, so what each epoch needs from
            # the main process crosses in shared memory: LitData's epoch, and the epoch a loaded state resumes.
            self.shared = multiprocessing.Array("i", 2)

        def set_epoch(self, current_epoch: int) -> None:
            super().set_epoch(current_epoch)  # in the main process, as LitData's loader starts each epoch
            self.shared[0] = self.current_epoch
            self.shared[1] = self._state_dict["current_epoch"] if self._state_dict else 0

        def __iter__(self):
            self.current_epoch, resumes = self.shared[0], self.shared[1]
            if not resumes:
                self._state_dict = None  # a state a persistent worker started with is for its first epoch only
            return super().__iter__()

        def record(self, index: int) -> tuple[bytes, int]:
            # While streaming, the reader expects the index it handed out, chunk and all; by position alone it
            # can read another worker's chunk. Validation and an unreadable image's neighbour go by position.
            streamed = self.streaming is not None and self.streaming.index == index
            item = super().__getitem__(self.streaming if streamed else index)
            image, label = (item["image"], item["label"]) if isinstance(item, dict) else item  # older packs: dicts
            return bytes(image), int(label)

        def __getitem__(self, index):
            self.streaming = index
            return self.images[(index.index, self.current_epoch)]

    return Records


class Chunked(Store):
    """A split read by index: validation's shards, and the neighbour that replaces an unreadable image. LitData
    opens what it reads, where it reads it."""

    def __init__(self, records, where: str, images: int):
        self.records, self.where, self.images = records, where, images

    def __len__(self) -> int:
        return self.images  # all of the split: LitData's own len is this process's share

    def read(self, index: int, run=None) -> tuple[bytes, int]:
        return self.records.record(index)

    def payload(self, index: int) -> bytes:
        return self.read(index)[0]

    def name(self, index: int) -> str:
        return f"{self.where}[{index}]"

    def files(self, indices: list[int]) -> list[Path]:
        return [] if s3.is_remote(self.where) else sorted(Path(self.where).glob("*.bin"))  # its chunks


def stream_loader_class():
    from litdata import StreamingDataLoader

    class Streamed(StreamingDataLoader):
        """LitData's loader with the place-in-epoch contract of loaders.SampledLoader.

        A state saved by as many processes and workers, with the same batch, is replayed exactly. Another
        layout makes LitData restripe what is left of the epoch over the new one ("elastic" resume); it then
        counts the samples it yields from the place it resumed at, and so does `state`.
        """
        resume_from = None  # a checkpoint's state, applied when its epoch starts
        restriped_at = None  # the images of this epoch trained before an elastic resume, where LitData counts from

        def set_epoch(self, epoch: int, skip_images: int = 0) -> None:
            self.restriped_at = None
            if self.resume_from is not None and self.resume_from["current_epoch"] == epoch + 1:
                if self.restriped(self.resume_from["dataset"]):
                    self.restriped_at = skip_images
                    saved = self.resume_from["dataset"]
                    log.info("format=litdata resumes on another layout (processes=%d, loader workers=%d; its stream "
                             "was saved with processes=%d, loader workers=%d): LitData restripes the rest of the epoch "
                             "over the new layout (its elastic resume), from a whole global batch of it, so what was "
                             "trained is left out but up to one such batch trains twice, and the batches differ from "
                             "an uninterrupted run's",
                             self.dataset.distributed_env.world_size, max(1, self.num_workers),
                             saved["world_size"], max(1, saved["num_workers"]))
                self.load_state_dict(self.resume_from)  # LitData counts epochs from 1
            else:
                self.current_epoch, self.restore = epoch, False  # its __iter__ moves on to epoch + 1
            self.resume_from = None

        def restriped(self, saved: dict) -> bool:
            layout = (self.dataset.distributed_env.world_size, max(1, self.num_workers), self.batch_size)
            return saved.get("resume_mode") == "elastic" or layout != (
                saved["world_size"], max(1, saved["num_workers"]), saved["batch_size"])

        def state(self, epoch: int, images_done: int) -> dict:
            """LitData's state_dict as it stood after `images_done` images of all processes (the loader itself
            has read ahead): workers hand batches over in turn, so the last one trained came from worker
            batches - 1, counted from where LitData's own count starts."""
            counted = images_done - (self.restriped_at or 0)
            batches = counted // (self.dataset.distributed_env.world_size * self.batch_size)
            samples = batches * self.batch_size
            dataset = self.dataset.state_dict(samples, self.num_workers, self.batch_size)
            restriped = {} if self.restriped_at is None else {"resume_mode": "elastic"}
            return {"dataset": {**dataset, **restriped, "current_epoch": epoch + 1}, "current_epoch": epoch + 1,
                    "num_samples_yielded": samples, "latest_worker_idx": (batches - 1) % max(1, self.num_workers)}

        def load_state(self, state: dict) -> None:
            self.resume_from = state or None

        def coverage(self) -> None:
            """LitData hands its workers their indices itself: this loader cannot tell which a batch holds."""
            return None

        def _get_iterator(self):
            iterator = super()._get_iterator()
            if self.num_workers > 0:
                # LitData's iterator holds its loader, which holds a persistent iterator: a cycle that only the
                # garbage collector frees, perhaps inside a worker forked later for another loader, where ending
                # these workers fails ("can only test a child process"). Held weakly, the loader's last reference
                # ends its workers at once, in the process that started them.
                iterator._loader = weakref.proxy(self)
            return iterator

    return Streamed


def streamed(path: str, cache_dir: str, max_cache_gb: float, endpoint_url: str | None) -> Stores:
    """The pack at `path`, its chunks cached in `cache_dir`."""
    options = storage_options(endpoint_url)
    path = path.rstrip("/")
    meta = checked_meta(path if s3.is_remote(path) else str(Path(path).expanduser()), endpoint_url)
    Records = split_dataset_class()

    def records(split: str, shuffle: bool):
        where = f"{path}/{split}"
        cache = Path(cache_dir).expanduser() / split
        cache.mkdir(parents=True, exist_ok=True)
        return Records(where if s3.is_remote(where) else str(Path(where).expanduser()), cache_dir=str(cache),
                       shuffle=shuffle, drop_last=True, storage_options=options,
                       max_cache_size=f"{max_cache_gb}GB",
                       batch_decode="item")  # "auto" unpacks a window of ~190 records around each shuffled read

    train, val = records("train", True), records("val", False)
    Streamed = stream_loader_class()

    def train_loader(images, *, world, batch_size, seed, collate, worker_init_fn, num_workers, prefetch_factor,
                     pin_memory, persistent_workers):
        del world  # LitData reads the processes' ranks from torch.distributed's environment itself
        train.images, train.seed = images, seed
        return Streamed(train, batch_size=batch_size, num_workers=num_workers, collate_fn=collate,
                        prefetch_factor=prefetch_factor if num_workers else None, pin_memory=pin_memory,
                        persistent_workers=persistent_workers and num_workers > 0, worker_init_fn=worker_init_fn,
                        drop_last=True)

    return Stores(*(Chunked(records, f"{path}/{split}", meta["splits"][split]["images"])
                    for records, split in ((train, "train"), (val, "val"))), meta["classes"], train_loader)


class Litdata(Format):
    """LitData's chunks, local or on S3; pack writes them in a local folder first, then uploads them where asked."""
    suffix = ""  # each split is a folder of chunks

    def __init__(self, path: str | None, cache_dir: str, max_cache_gb: float, endpoint_url: str | None):
        self.path, self.cache_dir, self.max_cache_gb, self.endpoint_url = path, cache_dir, max_cache_gb, endpoint_url

    def stores(self, source, stage) -> Stores:
        """The pack at format.path; `stage` is never asked: this format's facts say it streams (the loader assembly
        refuses a staging that copies)."""
        return streamed(self.path, self.cache_dir, self.max_cache_gb, self.endpoint_url)

    def write(self, path: Path, records, chunk_mb: float) -> None:
        """One split as LitData chunks of `chunk_mb` megabytes in the folder `path`, index.json last."""
        from litdata.streaming.writer import BinaryWriter
        path.mkdir()
        writer = BinaryWriter(str(path), chunk_bytes=max(1, int(chunk_mb * 2**20)))
        for index, (data, label) in enumerate(records):
            writer.add_item(index, (data, label))  # a tuple: LitData keeps it between the offsets, pyarrow or not
        writer.done()
        writer.merge()

    def exists(self, out: str) -> bool:
        """A local folder, or a finished pack (its pack.json) at an S3 prefix."""
        return META in s3.sizes_at(out, self.endpoint_url) if s3.is_remote(out) else super().exists(out)

    def publish(self, written: Path, out: str) -> None:
        """To S3, every file under `written`, each split's index then pack.json last, so that a reader never finds
        pack.json before everything it vouches for; a local pack, renamed."""
        if not s3.is_remote(out):
            return super().publish(written, out)
        s3.upload(written, out, self.endpoint_url, last=[*(f"{split}/{INDEX}" for split in SPLITS), META])
