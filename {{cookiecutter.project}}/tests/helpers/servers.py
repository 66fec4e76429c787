"""Servers on 127.0.0.1 that the tests start: a static file server that answers HEAD and Range requests, as a CDN or
an object store's HTTP endpoint does, and keeps a record of every request. Under /hub/ it answers as the Hugging Face
Hub's resolve URLs do: a redirect to the file on another host name (its CDN), and 401 to a request without the token
where one is asked for."""
import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Requests(list):
    """(method, path, the Range header or None) of each request, in order; `tokens`, the Authorization header each
    request sent (None: none), by path."""

    def __init__(self):
        super().__init__()
        self.tokens: list[tuple[str, str | None]] = []

    def reads(self, name: str) -> list[str | None]:
        """The Range header of each GET of the file `name` (None: the whole file)."""
        return [ranged for method, path, ranged in self if method == "GET" and path.endswith(f"/{name}")]


@contextlib.contextmanager
def serving(folder: Path, validators: bool = True, token: str | None = None) -> Iterator[tuple[str, Requests]]:
    """The files under `folder` at http://127.0.0.1:PORT/data/, and the requests the server answers. `validators`:
    whether it gives each file an ETag; `token`: the bearer token /hub/ asks for, if any. The same files are at
    http://127.0.0.1:PORT/hub/, each a redirect to http://localhost:PORT/data/<file>."""
    requests = Requests()

    class Files(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keeps the connection open between requests, as real servers do

        def log_message(self, *args):
            pass

        def file(self) -> Path | None:
            path = folder / self.path.removeprefix("/data/")
            return path if self.path.startswith("/data/") and path.is_file() else None

        def redirected(self) -> bool:
            """Answered as the Hub does, where the path is under /hub/: 401 without the token, else a redirect."""
            requests.tokens.append((self.path, self.headers.get("Authorization")))
            if not self.path.startswith("/hub/"):
                return False
            if token and self.headers.get("Authorization") != f"Bearer {token}":
                self.send(401, b"", 0, {})
            else:
                port = self.server.server_address[1]
                self.send(302, b"", 0, {"Location": f"http://localhost:{port}/data/{self.path.removeprefix('/hub/')}"})
            return True

        def send(self, status: int, body: bytes, length: int, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in {"Content-Length": str(length), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self):
            requests.append(("HEAD", self.path, None))
            if self.redirected():
                return
            path = self.file()
            if path is None:
                return self.send(404, b"", 0, {})
            stamp = path.stat()
            self.send(200, b"", stamp.st_size, {"ETag": f'"{stamp.st_mtime_ns}-{stamp.st_ino}"'} if validators else {})

        def do_GET(self):
            ranged = self.headers.get("Range")
            requests.append(("GET", self.path, ranged))
            if self.redirected():
                return
            path = self.file()
            if path is None:
                return self.send(404, b"", 0, {})
            data = path.read_bytes()
            if ranged is None:
                return self.send(200, data, len(data), {})
            first, last = (int(end) for end in ranged.removeprefix("bytes=").split("-"))
            part = data[first:last + 1]
            self.send(206, part, len(part), {"Content-Range": f"bytes {first}-{last}/{len(data)}"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/data", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
