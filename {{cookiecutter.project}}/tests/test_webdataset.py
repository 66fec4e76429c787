"""format=webdataset: tar shards read by index, timm's layout read as pack writes it, damaged shards refused in one
line. The round trip, the refusals every packed format shares and the tiny training runs are test_format.py's and
test_zoo.py's, which glob conf/format/."""
import json
import multiprocessing
import os
import re
import shutil
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.files import WriteError
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.format import webdataset as shards
from {{ cookiecutter.package }}.data.format.locations import S3, Http
from {{ cookiecutter.package }}.data.images import FileChanged, Images, make_splits, unread
from {{ cookiecutter.package }}.data.fit import check_fit
from {{ cookiecutter.package }}.data.loaders import make_loader
from {{ cookiecutter.package }}.data.staging import no_staging
from {{ cookiecutter.package }}.tools.pack import pack

from conftest import encoded, photo
from helpers.servers import serving

webdataset = pytest.importorskip("webdataset", reason="pip install -e '.[webdataset]'")

CPU = torch.device("cpu")


def open_shards(path: Path, train_shards: str | None = None, val_shards: str | None = None):
    return shards.Webdataset(str(path), train_shards, val_shards).stores(None, no_staging)


def write_shard(path: Path, samples: list[dict]) -> None:
    with webdataset.TarWriter(str(path)) as tar:
        for sample in samples:
            tar.write(sample)


def timm_folder(root: Path, info: bool = True) -> tuple[Path, dict]:
    """Shards as timm's imagenet-1k-wds has them (two training, one validation, .jpg and .cls) and its _info.json;
    the labels each split holds, in order."""
    root.mkdir()
    labels = {"train": [[3, 0, 7], [1, 3]], "validation": [[0, 7]]}
    splits = {}
    for split, per_shard in labels.items():
        names = [f"imagenet1k-{split}-{shard:02d}.tar" for shard in range(len(per_shard))]
        for name, shard_labels in zip(names, per_shard):
            write_shard(root / name, [{"__key__": f"n{label:08d}_{name[-6:-4]}{i}",
                                       "jpg": encoded(photo(40, 30, seed=i)), "cls": label}
                                      for i, label in enumerate(shard_labels)])
        splits[split] = {"name": split, "num_samples": sum(map(len, per_shard)), "filenames": names,
                         "shard_lengths": list(map(len, per_shard))}
    if info:
        (root / shards.INFO).write_text(json.dumps({"name": "imagenet-1k", "splits": splits}))
    return root, {split: sum(per_shard, []) for split, per_shard in labels.items()}


def test_a_timm_layout_folder_is_read_with_its_lengths_labels_and_bytes(tmp_path):
    root, labels = timm_folder(tmp_path / "in1k")
    stores = open_shards(root)
    assert len(stores.train) == 5 and len(stores.val) == 2
    assert stores.train.labels.tolist() == labels["train"] and stores.val.labels.tolist() == labels["validation"]
    assert stores.classes == [str(label) for label in range(8)]  # numbered: no pack.json names them
    assert stores.train.read(3) == (encoded(photo(40, 30, seed=0)), 1)
    assert stores.train.name(3) == f"{root / 'imagenet1k-train-01.tar'}[0]"
    assert stores.train.files([0, 4]) == [root / "imagenet1k-train-00.tar", root / "imagenet1k-train-01.tar"]


def test_the_index_is_kept_so_a_second_start_reads_no_shard(tmp_path, monkeypatch):
    root, labels = timm_folder(tmp_path / "in1k")
    open_shards(root)
    assert len(list(root.glob("_index-*.npz"))) == 2  # one per split

    def read_again(path):
        raise AssertionError(f"{path} read again")

    monkeypatch.setattr(shards, "index_shard", read_again)
    assert open_shards(root).train.labels.tolist() == labels["train"]


def test_a_folder_that_cannot_keep_the_index_is_indexed_in_memory(tmp_path, monkeypatch):
    root, labels = timm_folder(tmp_path / "in1k")

    def read_only(path, write):
        raise WriteError(f"could not write {path}: Read-only file system (EROFS)")

    monkeypatch.setattr(shards, "write_atomic", read_only)
    assert open_shards(root).train.labels.tolist() == labels["train"]
    assert sorted(path.name for path in root.iterdir() if not path.name.endswith(".tar")) == [shards.INFO]


def test_shards_without_info_are_named_by_brace_patterns(tmp_path):
    root, labels = timm_folder(tmp_path / "in1k", info=False)
    with pytest.raises(ConfigError) as refused:
        open_shards(root)
    assert str(refused.value) == (f"{root} has no _info.json listing its train shards: it is not a packed data set, "
                                  "or pass the shards' names, as in format.train_shards='train-{0000..0099}.tar'")
    stores = open_shards(root, "imagenet1k-train-{00..01}.tar", "imagenet1k-validation-00.tar")
    assert stores.train.labels.tolist() == labels["train"] and stores.val.labels.tolist() == labels["validation"]


def test_a_missing_shard_is_one_line_naming_it(tmp_path):
    root, _ = timm_folder(tmp_path / "in1k")
    with pytest.raises(ConfigError) as refused:
        open_shards(root, "imagenet1k-train-{00..02}.tar")
    assert str(refused.value) == (f"{root / 'imagenet1k-train-02.tar'} does not exist, though "
                                  "format.train_shards=imagenet1k-train-{00..02}.tar names it: fix the pattern, or "
                                  "copy the shard again")
    (root / "imagenet1k-validation-00.tar").unlink()
    with pytest.raises(ConfigError) as refused:
        open_shards(root)
    assert str(refused.value) == (f"{root / 'imagenet1k-validation-00.tar'} does not exist, though "
                                  f"{root / '_info.json'} names it: fix the pattern, or copy the shard again")


def test_a_truncated_shard_is_one_line_naming_it(tmp_path):
    root, _ = timm_folder(tmp_path / "in1k")
    shard = root / "imagenet1k-train-01.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:data.index(encoded(photo(40, 30, seed=1))) + 10])  # cut in its last image
    with pytest.raises(ConfigError) as refused:
        open_shards(root)
    assert str(refused.value) == (f"{shard} is not a readable tar shard (n00000003_011.jpg runs past the end of the "
                                  "file): truncated or damaged; write it again")


def test_a_shard_holding_fewer_samples_than_info_says_is_refused(tmp_path):
    root, _ = timm_folder(tmp_path / "in1k")
    info = json.loads((root / shards.INFO).read_text())
    info["splits"]["train"]["shard_lengths"] = [3, 4]
    (root / shards.INFO).write_text(json.dumps(info))
    with pytest.raises(ConfigError) as refused:
        open_shards(root)
    assert str(refused.value) == (f"{root / 'imagenet1k-train-01.tar'} holds 2 samples where {root / '_info.json'} "
                                  "says 4: truncated or replaced; copy or write it again")


@pytest.mark.parametrize("sample, message", [
    ({"__key__": "a", "jpg": b"x"}, "sample a has no .cls, where every sample keeps its class number; write the "
                                    "shard again with one"),
    ({"__key__": "a", "cls": 1}, "sample a has no image (jpg, jpeg, png, webp); drop it from the shard or add its "
                                 "image"),
    ({"__key__": "a", "jpg": b"x", "cls": b"cat"}, "a.cls holds b'cat', not a class number; write the shard again"),
])
def test_a_sample_without_its_label_or_image_is_one_line(tmp_path, sample, message):
    root, _ = timm_folder(tmp_path / "in1k")
    write_shard(root / "imagenet1k-validation-00.tar", [sample])
    with pytest.raises(ConfigError) as refused:
        open_shards(root)
    assert str(refused.value) == f"{root / 'imagenet1k-validation-00.tar'}: {message}"


def test_an_unreadable_image_is_skipped_and_counted_as_in_every_format(tmp_path):
    root, _ = timm_folder(tmp_path / "in1k")
    write_shard(root / "imagenet1k-train-01.tar", [{"__key__": "bad", "jpg": b"not a jpeg", "cls": 1},
                                                   {"__key__": "good", "jpg": encoded(photo(40, 30)), "cls": 3}])
    source = sources.folder(None, 16, 20, "skip", max_bad_fraction=0.5)
    splits = make_splits(source, open_shards(root), PilDecoder())
    batches = make_loader(splits.train, 2, False, 0, World(0, 0, 1, CPU), num_workers=0, prefetch_factor=2,
                          pin_memory=False, persistent_workers=False, collate=splits.decoder.collate)
    assert sum(len(labels) for _, labels in batches) == 5  # the bad image's place taken by another
    assert splits.skipped_files(World(0, 0, 1, CPU)) == 1


class Checksums(torch.utils.data.Dataset):
    """Each sample's bytes as a checksum, with its label, for the key the sampler asks for."""

    def __init__(self, store):
        self.store = store

    def __len__(self):
        return len(self.store)

    def __getitem__(self, key):
        data, label = self.store.read(key[0])
        return torch.tensor([zlib.crc32(data), label])


def test_two_ranks_take_every_sample_once_an_epoch_with_the_source_labels(packs, tiny_root):
    store = open_shards(packs["webdataset"]).train
    classes = sorted(path.name for path in (tiny_root / "train").iterdir())
    source = sorted([zlib.crc32(path.read_bytes()), classes.index(path.parent.name)]
                    for path in (tiny_root / "train").rglob("*") if path.is_file())
    assert len(store.files(list(range(len(store))))) > 1, "several shards: chunk_mb is small in the packs fixture"
    for epoch in (0, 1):
        taken = []
        for rank in (0, 1):
            loader = make_loader(Checksums(store), 3, True, 0, World(rank, rank, 2, CPU), num_workers=0,
                                 prefetch_factor=2, pin_memory=False, persistent_workers=False)
            loader.set_epoch(epoch)
            taken.append([row.tolist() for batch in loader for row in batch])
        assert len(taken[0]) == len(taken[1]) == len(source) // 2
        assert sorted(taken[0] + taken[1]) == source


def test_pack_lists_its_shards_in_timm_info_and_keeps_their_index(packs, tmp_path):
    copy = shutil.copytree(packs["webdataset"], tmp_path / "copy")
    info = json.loads((copy / shards.INFO).read_text())
    stores = open_shards(copy)
    for split, store in (("train", stores.train), ("validation", stores.val)):
        listed = info["splits"][split]
        assert listed["num_samples"] == sum(listed["shard_lengths"]) == len(store)
        assert [str(copy / name) for name in listed["filenames"]] == [store.where.where(name) for name in store.names]
        assert all(tarfile.is_tarfile(path) for path in store.files(list(range(len(store)))))
    assert len(list(copy.glob("_index-*.npz"))) == 2, "pack indexed both splits: the first start reads no shard"
    assert np.array_equal(stores.train.labels, open_shards(packs["webdataset"]).train.labels)


def open_remote(url: str, cache: Path, train_shards: str | None = None):
    return shards.Webdataset(url, train_shards, None, str(cache)).stores(None, no_staging)


def test_shards_over_http_read_as_local_ones_by_range_one_request_per_shard_a_run_spans(tmp_path):
    root, labels = timm_folder(tmp_path / "in1k")
    local = open_shards(root)
    with serving(root) as (url, requests):
        remote = open_remote(url, tmp_path / "cache")
        assert remote.train.labels.tolist() == labels["train"] and remote.val.labels.tolist() == labels["validation"]
        assert [remote.train.read(index) for index in range(5)] == [local.train.read(index) for index in range(5)]
        assert remote.train.name(3) == f"{url}/imagenet1k-train-01.tar[0]" and remote.train.files([0, 4]) == []
        assert requests.reads("imagenet1k-train-00.tar")[0] is None, "indexed in one stream through the shard"

        requests.clear()
        assert remote.train.payloads(1, 5) == [local.train.payload(index) for index in range(1, 5)]
        first = local.train.offset[1], local.train.offset[2] + local.train.size[2] - 1  # samples 1-2 of shard 0
        last = local.train.offset[3], local.train.offset[4] + local.train.size[4] - 1  # samples 0-1 of shard 1
        assert [ranged for _, _, ranged in requests] == [f"bytes={first[0]}-{first[1]}", f"bytes={last[0]}-{last[1]}"]

        requests.clear()
        open_remote(url, tmp_path / "cache")  # the index kept in the cache: no shard is read again
        assert not [path for method, path, _ in requests if method == "GET" and path.endswith(".tar")]


def test_a_missing_truncated_or_unreachable_remote_shard_is_one_line_naming_it(tmp_path):
    root, _ = timm_folder(tmp_path / "in1k")
    with serving(root) as (url, _):
        with pytest.raises(ConfigError) as refused:
            open_remote(url, tmp_path / "cache", "imagenet1k-train-{00..02}.tar")
        assert str(refused.value) == (f"{url}/imagenet1k-train-02.tar does not exist, though format.train_shards="
                                      "imagenet1k-train-{00..02}.tar names it: fix the pattern, or copy the shard again")
        shard = root / "imagenet1k-train-01.tar"
        data = shard.read_bytes()
        shard.write_bytes(data[:data.index(encoded(photo(40, 30, seed=1))) + 10])  # cut in its last image
        with pytest.raises(ConfigError) as refused:
            open_remote(url, tmp_path / "cache")
        assert str(refused.value).startswith(f"{url}/imagenet1k-train-01.tar is not a readable tar shard (")
        assert str(refused.value).endswith("): truncated or damaged; write it again")
    with pytest.raises(ConfigError) as refused:  # the server is gone
        open_remote(url, tmp_path / "cache")
    assert str(refused.value).startswith(f"format.path={url} cannot be read: ")


def test_a_refused_stream_closes_its_connection(tmp_path):
    (tmp_path / "there.tar").write_bytes(b"shard")
    with serving(tmp_path) as (url, _):
        location = Http(url)
        answered = []
        request = location.session().request
        location.session().request = lambda *args, **kwargs: answered.append(request(*args, **kwargs)) or answered[-1]
        assert location.stream("there.tar").read() == b"shard"
        with pytest.raises(FileNotFoundError, match=re.escape(f"answered HTTP 404: no such file: '{url}/missing.tar'")):
            location.stream("missing.tar")
    assert [response.status_code for response in answered] == [200, 404]
    assert answered[1].raw.closed  # refused: nothing will read this response, so its connection ends there


def test_a_shard_rewritten_at_the_same_size_and_mtime_is_indexed_again(tmp_path):
    """tar pads a shard to whole 10,240-byte records, so a shard relabelled keeps its size, and cp -p, rsync -t or tar
    put its mtime back: only its ctime tells."""
    root, labels = timm_folder(tmp_path / "in1k")
    assert open_shards(root).train.labels.tolist() == labels["train"]
    shard = root / "imagenet1k-train-00.tar"
    before = shard.stat()
    write_shard(tmp_path / "relabelled.tar", [{"__key__": f"n{label:08d}_00{i}", "jpg": encoded(photo(40, 30, seed=i)),
                                                "cls": label} for i, label in enumerate([4, 1, 8])])
    shutil.copyfile(tmp_path / "relabelled.tar", shard)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (shard.stat().st_size, shard.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert open_shards(root).train.labels.tolist() == [4, 1, 8, 1, 3]
    assert len(list(root.glob("_index-*.npz"))) == 2, "the stale index of the training split is gone"


def test_hub_resolve_urls_redirect_to_their_cdn_and_the_token_goes_to_the_hub_alone(tmp_path, monkeypatch):
    root, labels = timm_folder(tmp_path / "in1k")
    local = open_shards(root)
    monkeypatch.setenv("SHARDS_TOKEN", "s3cret")
    with serving(root, token="s3cret") as (url, requests):
        hub = url.replace("/data", "/hub")
        remote = shards.Webdataset(hub, cache_dir=str(tmp_path / "cache"), token_env="SHARDS_TOKEN").stores(
            None, no_staging)
        assert remote.train.labels.tolist() == labels["train"] and remote.val.labels.tolist() == labels["validation"]
        assert remote.train.payloads(1, 5) == [local.train.payload(index) for index in range(1, 5)]
        assert {token for path, token in requests.tokens if path.startswith("/hub/")} == {"Bearer s3cret"}
        assert {token for path, token in requests.tokens if path.startswith("/data/")} == {None}, "the CDN gets none"
        monkeypatch.delenv("SHARDS_TOKEN")
        with pytest.raises(ConfigError) as refused:
            shards.Webdataset(hub, cache_dir=str(tmp_path / "cache"), token_env="SHARDS_TOKEN").stores(None, no_staging)
    assert str(refused.value) == (f"format.path={hub} cannot be read: {hub}/pack.json: answered HTTP 401 Unauthorized "
                                  "(is the token in $SHARDS_TOKEN set and allowed?); check the address, that its "
                                  "server is up and the credentials")


def test_a_server_that_gives_no_version_keeps_no_index_and_says_so(tmp_path, caplog):
    root, labels = timm_folder(tmp_path / "in1k")
    with serving(root, validators=False) as (url, requests):
        with caplog.at_level("WARNING"):
            assert open_remote(url, tmp_path / "cache").train.labels.tolist() == labels["train"]
    assert not list((tmp_path / "cache").rglob("*.npz"))
    assert f"{url}/imagenet1k-train-00.tar and 1 more shards: no ETag or Last-Modified, so a kept index could not " \
           "tell a rewritten shard; none is kept, and each process indexes the shards at each start" in caplog.text


def test_the_processes_of_a_node_stream_each_remote_shard_once_to_index_it(tmp_path):
    """Three processes start at once, as the ranks of a node do: the first indexes, the others wait and read its index."""
    root, _ = timm_folder(tmp_path / "in1k")
    with serving(root) as (url, requests):
        starting = [multiprocessing.get_context("fork").Process(target=open_remote, args=(url, tmp_path / "cache"))
                    for _ in range(3)]
        for process in starting:
            process.start()
        for process in starting:
            process.join(timeout=120)
    assert [process.exitcode for process in starting] == [0, 0, 0]
    streamed = [path for method, path, ranged in requests if method == "GET" and path.endswith(".tar") and not ranged]
    assert sorted(streamed) == [f"/data/imagenet1k-{split}.tar" for split in ("train-00", "train-01", "validation-00")]


def test_a_remote_shard_gone_mid_run_is_one_line_naming_it(tmp_path):
    root, _ = timm_folder(tmp_path / "in1k")
    with serving(root) as (url, _):
        remote = open_remote(url, tmp_path / "cache")
        (root / "imagenet1k-train-01.tar").unlink()
        with pytest.raises(FileChanged) as raised:
            Images(remote.train, len, "skip")[3]
    assert str(raised.value) == (
        f"could not read {url}/imagenet1k-train-01.tar[0]: answered HTTP 404: no such file (ENOENT): the data set "
        "changed since it was opened: put the shard back, or write the shards again: the next start indexes them anew")


def test_an_s3_object_gone_mid_run_is_one_line_naming_it():
    moto = pytest.importorskip("moto", reason="pip install moto")
    with moto.mock_aws():
        import boto3
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="images")
        boto3.client("s3", region_name="us-east-1").put_object(Bucket="images", Key="data/there.tar", Body=b"shard")
        bucket = S3("s3://images/data", None)
        assert bucket.read("there.tar", 1, 3) == b"har"
        with pytest.raises(FileNotFoundError) as raised:
            bucket.read("gone.tar", 0, 3)
    failure = unread("s3://images/data/gone.tar[0]", raised.value, shards.Shards.when_changed)
    assert isinstance(failure, FileChanged) and str(failure) == (
        "could not read s3://images/data/gone.tar[0]: no such object (ENOENT): the data set changed since it was "
        "opened: put the shard back, or write the shards again: the next start indexes them anew")


@pytest.mark.parametrize("path", ["http://127.0.0.1:9/data", "s3://images/data"])
def test_remote_shards_are_not_staged(path, compose_tiny):
    cfg = compose_tiny("format=webdataset", f"format.path={path}", "staging=tmpfs")
    with pytest.raises(ConfigError, match=rf"^staging=tmpfs copies local files, and format.path={path} is remote: "):
        check_fit(cfg.format, cfg.staging, cfg.decoder, cfg.order)
    check_fit(cfg.format, compose_tiny("staging=none").staging, cfg.decoder, cfg.order)


def test_a_run_in_blocks_over_http_trains_every_image_once_each_block_in_one_request(tiny_root, tmp_path,
                                                                                     train_in_process):
    pack(tiny_root, "webdataset", tmp_path / "pack", None, 90, 2, False, "raise")  # one shard a split
    with serving(tmp_path / "pack") as (url, requests):
        summary = train_in_process("format=webdataset", f"format.path={url}", f"format.cache_dir={tmp_path / 'cache'}",
                                   "order=blocks", "order.block=4", "order.window=2", "loader.num_workers=2")
    assert summary.steps == 6 and summary.skipped_files == 0
    assert [(entry["trained"], entry["left_out"]) for entry in summary.coverage] == [(24, 0)]
    store = open_shards(tmp_path / "pack").train
    blocks = {f"bytes={store.offset[first]}-{store.offset[first + 3] + store.size[first + 3] - 1}"
              for first in range(0, 24, 4)}
    reads = [ranged for _, path, ranged in requests if path.endswith("train/000000.tar") and ranged]
    assert set(reads) == blocks, "each read is a whole block of 4 images, and every block is read"
