"""Where a format's files are: a local folder, an S3 prefix (`s3://bucket/prefix`) or an HTTP(S) address
(`https://host/path`), each file read by its name under it: whole, a byte range, or as a stream.

A range is one request, which is what lets a format read one record out of a large remote file, or a run of
records end to end in one go. Each process opens its own client at its first read (a connection must not cross a
fork), and keeps its connections open between reads. A failed request is an OSError naming the file, with the errno
a read mid-run is judged by (data/images.py): gone, forbidden, or the storage failing.
"""
import errno
import os
from pathlib import Path

from ...core.files import version
from . import s3


class Local:
    """A local folder."""
    remote = False

    def __init__(self, folder: Path):
        self.folder = folder

    def where(self, name: str) -> str:
        return str(self.folder / name)

    def stat(self, name: str) -> tuple[int, str] | None:
        """(bytes, a version that changes when the file is rewritten: core.files.version), or None where there is no
        such file."""
        path = self.folder / name
        return (path.stat().st_size, version(path)) if path.is_file() else None

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
    """An HTTP(S) address whose server answers HEAD and Range requests, as a static file server, a CDN or the Hugging
    Face Hub's file URLs (which redirect to their CDN) do. Redirects are followed; any answer but a 2xx is an error.
    A bearer token from the environment variable `token_env`, where it is set, goes to format.path's host alone:
    requests drops it on a redirect to another host, as the Hub's CDN wants. Each process opens its own HTTP session,
    and a request a server answers 429 or 5xx to, or drops, is made again up to RETRIES times, waiting longer each
    time."""
    remote = True
    RETRIES, BACKOFF = 3, 0.5  # the seconds waited before the second try; twice that before each one after

    def __init__(self, url: str, token_env: str | None = None):
        self.url, self.token_env = url.rstrip("/"), token_env
        self._session, self._pid = None, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_session": None, "_pid": None}

    def session(self):
        if self._pid != os.getpid():
            import requests
            from requests.adapters import HTTPAdapter
            from urllib3.util import Retry
            session = requests.Session()
            retry = Retry(total=self.RETRIES, backoff_factor=self.BACKOFF, status_forcelist=(429, 500, 502, 503, 504),
                          allowed_methods=("HEAD", "GET"), raise_on_status=False)
            for scheme in ("http://", "https://"):
                session.mount(scheme, HTTPAdapter(max_retries=retry))
            if token := os.environ.get(self.token_env or "", ""):
                session.headers["Authorization"] = f"Bearer {token}"
            self._session, self._pid = session, os.getpid()
        return self._session

    def request(self, method: str, name: str, **kwargs):
        """The response to `method` on the file `name`, its redirects followed; None where there is no such file
        (404, 410). Any other answer but a 2xx, and a server that cannot be reached, is an OSError naming the file
        whose errno says what a read that meets it mid-run means (core.files.STORAGE_FAILED: the server, not the
        image)."""
        import requests
        where = self.where(name)
        try:
            response = self.session().request(method, where, allow_redirects=True, timeout=60, **kwargs)
        except requests.Timeout as err:
            raise TimeoutError(errno.ETIMEDOUT, f"no answer in time ({type(err).__name__})", where) from None
        except requests.RequestException as err:
            raise ConnectionAbortedError(errno.ECONNABORTED, f"cannot be reached ({err})", where) from None
        if response.status_code in (404, 410):
            response.close()
            return None
        if not 200 <= response.status_code < 300:
            response.close()
            code = errno.EACCES if response.status_code in (401, 403) else errno.EIO
            token = (f"is the token in ${self.token_env} set and allowed?" if self.token_env else
                     "pass format.token_env=<the environment variable that holds its token>")
            raise OSError(code, f"answered HTTP {response.status_code} {response.reason}"
                                + (f" ({token})" if code == errno.EACCES else ""), where)
        return response

    def found(self, method: str, name: str, **kwargs):
        """The response to a request for a file that must be there: a missing one is FileNotFoundError."""
        response = self.request(method, name, **kwargs)
        if response is None:
            raise FileNotFoundError(errno.ENOENT, "answered HTTP 404: no such file", self.where(name))
        return response

    def where(self, name: str) -> str:
        return f"{self.url}/{name}" if name else self.url

    def stat(self, name: str) -> tuple[int, str] | None:
        """(bytes, ETag or Last-Modified, "" where the server gives neither), or None where there is no such file."""
        response = self.request("HEAD", name)
        if response is None:
            return None
        headers = response.headers
        return int(headers.get("content-length", -1)), headers.get("etag") or headers.get("last-modified") or ""

    def text(self, name: str) -> str | None:
        response = self.request("GET", name)
        return None if response is None else response.content.decode()

    def read(self, name: str, offset: int, size: int) -> bytes:
        response = self.found("GET", name, headers={"Range": f"bytes={offset}-{offset + size - 1}"})
        body = response.content
        return body if response.status_code == 206 else body[offset:offset + size]  # a server that ignores ranges

    def stream(self, name: str):
        """The file's bytes as a stream, read once through; its connection ends when it is closed."""
        raw = self.found("GET", name, stream=True).raw
        raw.decode_content = True  # as sent, where a server compressed it on the way
        return raw


def is_address(path: str) -> bool:
    """Whether `path` names object storage or a web server rather than a local file or folder."""
    return s3.is_remote(path) or path.startswith(("http://", "https://"))


def location(path: str, endpoint_url: str | None = None, token_env: str | None = None) -> "Local | S3 | Http":
    if s3.is_remote(path):
        return S3(path, endpoint_url)
    if is_address(path):
        return Http(path, token_env)
    return Local(Path(path).expanduser())


def said(err: OSError) -> str:
    """An OSError in words: the file and what happened to it."""
    return f"{err.filename}: {err.strerror}" if err.filename and err.strerror else str(err).splitlines()[0]
