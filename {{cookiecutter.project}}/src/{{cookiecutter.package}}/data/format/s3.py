"""A pack at an S3 prefix (`s3://bucket/prefix`) or in a local folder, for the formats whose facts say `remote`: its
files listed with their sizes, its small files read, and a pack written locally uploaded. Credentials come from the
usual AWS_* environment variables; `endpoint_url` names an S3-compatible store (MinIO, Ceph)."""
from pathlib import Path


def is_remote(path: str) -> bool:
    return path.startswith("s3://")


def client(endpoint_url: str | None):
    import boto3  # LitData's own dependency
    return boto3.client("s3", endpoint_url=endpoint_url or None)


def bucket_and_key(url: str) -> tuple[str, str]:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return bucket, key.rstrip("/")


def sizes_at(path: str, endpoint_url: str | None) -> dict[str, int]:
    """Every file under `path` (relative name -> bytes), local or on S3."""
    if not is_remote(path):
        root = Path(path).expanduser()
        return {str(file.relative_to(root)): file.stat().st_size for file in root.rglob("*") if file.is_file()}
    bucket, prefix = bucket_and_key(path)
    pages = client(endpoint_url).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
    return {item["Key"][len(prefix) + 1:]: item["Size"] for page in pages for item in page.get("Contents", [])}


def read_text(path: str, name: str, endpoint_url: str | None) -> str:
    if not is_remote(path):
        return (Path(path).expanduser() / name).read_text()
    bucket, prefix = bucket_and_key(path)
    return client(endpoint_url).get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read().decode()


def read_head(path: str, name: str, length: int, endpoint_url: str | None) -> bytes:
    """The first `length` bytes of a file under `path`: one range request on S3."""
    if not is_remote(path):
        with (Path(path).expanduser() / name).open("rb") as file:
            return file.read(length)
    bucket, prefix = bucket_and_key(path)
    return client(endpoint_url).get_object(Bucket=bucket, Key=f"{prefix}/{name}",
                                           Range=f"bytes=0-{length - 1}")["Body"].read()


def upload(folder: Path, url: str, endpoint_url: str | None, last: list[str]) -> None:
    """Every file under `folder` to the prefix `url`, the files named in `last` (relative to `folder`) at the end, in
    their order; the last of them is deleted first, so that a pack being overwritten reads as unfinished until done."""
    bucket, prefix = bucket_and_key(url)
    storage = client(endpoint_url)
    storage.delete_object(Bucket=bucket, Key=f"{prefix}/{last[-1]}")
    files = sorted(str(file.relative_to(folder)) for file in folder.rglob("*") if file.is_file())
    for name in [*(name for name in files if name not in last), *last]:
        storage.upload_file(str(folder / name), bucket, f"{prefix}/{name}")
