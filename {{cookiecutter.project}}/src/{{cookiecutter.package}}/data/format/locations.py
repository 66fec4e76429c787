"""Where a format's files are: a local folder, an S3 prefix (`s3://bucket/prefix`) or an HTTP(S) address
(`https://host/path`), each file read by its name under it: whole, a byte range, or as a stream.

A range is one request, which is what lets a format read one record out of a large remote file, or a run of
records end to end in one go. Each process opens its own client at its first read (a connection must not cross a
fork); HTTP keeps its connection open between reads, as S3's client keeps its pool.
"""
import errno
import http.client
import os
from pathlib import Path
from urllib.parse import urlsplit

from . import s3


class Local:
    """A local folder."""
    remote = False

    def __init__(self, folder: Path):
        self.folder = folder

    def where(self, name: str) -> str:
        return str(self.folder / name)

    def stat(self, name: str) -> tuple[int, str] | None:
        """(bytes, a version that changes when the file is rewritten), or None where there is no such file. The version
        is the file's mtime, ctime and inode, as the folder format stamps its folders: a file rewritten at the same
        size with its old mtime put back (tar pads shards to whole records; cp -p, rsync -t) still gets a new ctime,
        and one replaced by a rename a new inode."""
        path = self.folder / name
        if not path.is_file():
            return None
        stat = path.stat()
        return stat.st_size, f"{stat.st_mtime_ns}.{stat.st_ctime_ns}.{stat.st_ino}"

    def text(self, name: str) -> str | None:
        try:
            return (self.folder / name).read_text()
        except FileNotFoundError:
            return None

    def read(self, name: str, offset: int, size: int) -> bytes:
        # Opened at each read: a split of thousands of shards would hold more files open than a process may.
        with open(self.folder / name, "rb") as file:
            return os.pread(file.fileno(), size, offset)

    def stream(self, name: str):
        return open(self.folder / name, "rb")


class S3:
    """An S3 prefix; `endpoint_url` names an S3-compatible store, credentials come from the AWS_* variables."""
    remote = True

    def __init__(self, url: str, endpoint_url: str | None):
        self.url, self.endpoint_url = url.rstrip("/"), endpoint_url
        self.bucket, self.prefix = s3.bucket_and_key(self.url)
        self._client, self._pid = None, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None, "_pid": None}

    def client(self):
        if self._pid != os.getpid():
            self._client, self._pid = s3.client(self.endpoint_url), os.getpid()
        return self._client

    def where(self, name: str) -> str:
        return f"{self.url}/{name}" if name else self.url

    def call(self, method: str, name: str, **kwargs) -> dict | None:
        """The client's `method` on the object `name`; None where there is no such object. Any other failure (no
        bucket, no access, no endpoint) is an OSError naming the object, whose errno says what a read that meets it
        mid-run means (core.files.STORAGE_FAILED: the store, not the image)."""
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            return getattr(self.client(), method)(Bucket=self.bucket, Key=f"{self.prefix}/{name}", **kwargs)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                return None
            raise OSError(errno.EACCES if code in ("AccessDenied", "403") else errno.EIO, str(err),
                          self.where(name)) from None
        except BotoCoreError as err:
            raise ConnectionAbortedError(errno.ECONNABORTED, str(err), self.where(name)) from None

    def stat(self, name: str) -> tuple[int, str] | None:
        head = self.call("head_object", name)
        return None if head is None else (head["ContentLength"], head["ETag"])

    def text(self, name: str) -> str | None:
        found = self.call("get_object", name)
        return None if found is None else found["Body"].read().decode()

    def found(self, method: str, name: str, **kwargs) -> dict:
        """The client's `method` on an object that must be there: a missing one is FileNotFoundError, which a read
        mid-run turns into the line that says the data set changed."""
        answer = self.call(method, name, **kwargs)
        if answer is None:
            raise FileNotFoundError(errno.ENOENT, "no such object", self.where(name))
        return answer

    def read(self, name: str, offset: int, size: int) -> bytes:
        return self.found("get_object", name, Range=f"bytes={offset}-{offset + size - 1}")["Body"].read()

    def stream(self, name: str):
        return self.found("get_object", name)["Body"]


class Http:
    """An HTTP(S) address whose server answers HEAD and Range requests, as a static file server, a CDN or the
    Hugging Face Hub's file URLs do."""
    remote = True

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        self.secure, self.host, self.path = parts.scheme == "https", parts.netloc, parts.path
        self._connection, self._pid = None, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_connection": None, "_pid": None}

    def connect(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.secure else http.client.HTTPConnection
        return kind(self.host, timeout=60)

    def request(self, method: str, name: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
        """One request on this process's open connection; made once more on a new one where the server closed
        the last between reads, as servers close idle connections."""
        try:
            return self.exchange(method, name, headers or {})
        except (http.client.HTTPException, ConnectionError):
            self._connection.close()
            self._connection = None
            return self.exchange(method, name, headers or {})

    def exchange(self, method: str, name: str, headers: dict) -> tuple[int, dict, bytes]:
        if self._pid != os.getpid() or self._connection is None:
            self._connection, self._pid = self.connect(), os.getpid()
        self._connection.request(method, f"{self.path}/{name}", headers=headers)
        response = self._connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()

    def where(self, name: str) -> str:
        return f"{self.url}/{name}" if name else self.url

    def checked(self, status: int, name: str) -> None:
        if status >= 400:
            raise OSError(f"{self.where(name)} answered HTTP {status}")

    def stat(self, name: str) -> tuple[int, str] | None:
        status, headers, _ = self.request("HEAD", name)
        if status == 404:
            return None
        self.checked(status, name)
        headers = {key.lower(): value for key, value in headers.items()}
        return int(headers["content-length"]), headers.get("etag") or headers.get("last-modified", "")

    def text(self, name: str) -> str | None:
        status, _, body = self.request("GET", name)
        if status == 404:
            return None
        self.checked(status, name)
        return body.decode()

    def read(self, name: str, offset: int, size: int) -> bytes:
        status, _, body = self.request("GET", name, {"Range": f"bytes={offset}-{offset + size - 1}"})
        self.checked(status, name)
        return body if status == 206 else body[offset:offset + size]  # a server that ignores ranges sends it all

    def stream(self, name: str):
        connection = self.connect()  # its own: a stream read over minutes must not hold up the reads by range
        connection.request("GET", f"{self.path}/{name}")
        response = connection.getresponse()
        if response.status >= 400:  # refused: nothing will read this response, so its connection ends here
            connection.close()
        self.checked(response.status, name)
        return response


def is_address(path: str) -> bool:
    """Whether `path` names object storage or a web server rather than a local file or folder."""
    return s3.is_remote(path) or path.startswith(("http://", "https://"))


def location(path: str, endpoint_url: str | None = None) -> "Local | S3 | Http":
    if s3.is_remote(path):
        return S3(path, endpoint_url)
    if is_address(path):
        return Http(path)
    return Local(Path(path).expanduser())
