"""client/http_client.py: the standard-library client RemoteService uses for an http:// service."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fxcc.client import http_client
from fxcc.client.remote import RemoteService, ServiceError


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the service's server does

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Seen-Auth", self.headers.get("Authorization", ""))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        server = self.server
        server.connections.add(self.client_address)  # type: ignore[attr-defined]
        if self.path.startswith("/v1/pre-aot/missing"):
            self._answer(404, b'{"detail": "no entry"}')
        elif self.path.startswith("/v1/pre-aot/"):
            self._answer(200, json.dumps({"path": self.path}).encode())
        elif self.path == "/drop-after":
            self._answer(200, b'{"ok": true}')
            self.close_connection = True  # closed without saying so: the client's kept connection is dead
        else:
            self._answer(500, b"boom", "text/plain")

    def do_POST(self) -> None:
        self.server.connections.add(self.client_address)  # type: ignore[attr-defined]
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        items = [{"key": key, "missing": True} for key in asked["keys"]]
        for item in [*items, {"done": True, "not_sent": []}]:  # as routes/artifacts.py's batch ends
            line = json.dumps(item).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.connections = set()  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


@contextmanager
def _client(server: ThreadingHTTPServer, headers: dict[str, str] | None = None) -> Iterator[http_client.Client]:
    """A client of `server`, closed after the block."""
    client = http_client.Client(_url(server), headers, timeout=5)
    try:
        yield client
    finally:
        client.close()


def test_answers_headers_and_one_kept_connection(server: ThreadingHTTPServer) -> None:
    with _client(server, {"Authorization": "Bearer t"}) as client:
        r = client.request("GET", "/v1/pre-aot/abc", params={"wait": 3})
        assert r.status_code == 200 and r.json() == {"path": "/v1/pre-aot/abc?wait=3"}
        assert r.headers.get("x-seen-auth") == "Bearer t" and r.headers["Content-Type"] == "application/json"
        missing = client.request("GET", "/v1/pre-aot/missing")
        assert missing.status_code == 404 and missing.json() == {"detail": "no entry"}
        failed = client.request("GET", "/other")
        assert failed.status_code == 500 and failed.text == "boom"
        with pytest.raises(http_client.HTTPStatusError):
            failed.raise_for_status()
    assert len(server.connections) == 1  # type: ignore[attr-defined]


def test_a_connection_the_server_closed_is_replaced(server: ThreadingHTTPServer) -> None:
    with _client(server) as client:
        assert client.request("GET", "/drop-after").json() == {"ok": True}
        assert client.request("GET", "/v1/pre-aot/x").json() == {"path": "/v1/pre-aot/x"}
    assert len(server.connections) == 2  # type: ignore[attr-defined]


def test_streamed_lines(server: ThreadingHTTPServer) -> None:
    with _client(server) as client:
        with client.stream("POST", "/v1/artifacts/batch", json={"keys": ["a", "b"]}) as r:
            assert r.status_code == 200
            lines = [json.loads(line) for line in r.iter_lines() if line]
        assert lines == [{"key": "a", "missing": True}, {"key": "b", "missing": True},
                         {"done": True, "not_sent": []}]
        assert client.request("GET", "/v1/pre-aot/y").status_code == 200  # the connection is whole again
    assert len(server.connections) == 1  # type: ignore[attr-defined]


def test_remote_service_over_it(server: ThreadingHTTPServer) -> None:
    remote = RemoteService(_url(server), "tok", timeout_s=5)
    try:
        assert isinstance(remote.http, http_client.Client)
        assert remote.get_pre_aot("missing") is None
        assert remote.get_pre_aot("k1") == {"path": "/v1/pre-aot/k1"}
        assert remote.get_artifacts(["a" * 64, "b" * 64]) == {}  # both missing, over one streamed batch
        with pytest.raises(ServiceError, match="500"):
            remote.get_artifact("c" * 64)
    finally:
        remote.close()


def test_unreachable_service_is_a_service_error() -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as srv:
        port = srv.server_address[1]  # closed when the block ends: nothing listens there after
    remote = RemoteService(f"http://127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(ServiceError, match="unreachable"):
        remote.get_pre_aot("k")


def test_no_httpx_on_the_plain_http_path(server: ThreadingHTTPServer) -> None:
    """A request to an http:// service imports neither httpx nor httpcore (nor trio, anyio)."""
    code = ("import sys\nfrom fxcc.client.remote import RemoteService\n"
            f"r = RemoteService({_url(server)!r})\nassert r.get_pre_aot('k') == {{'path': '/v1/pre-aot/k'}}\n"
            "print(sorted(m for m in ('httpx', 'httpcore', 'trio', 'anyio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_proxied_service_is_asked_through_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY routes an http:// service through httpx (which honours it); NO_PROXY does not."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    proxied = RemoteService("http://fxcc.example:8000")
    assert not isinstance(proxied.http, http_client.Client)
    proxied.close()
    monkeypatch.setenv("NO_PROXY", "fxcc.example")
    direct = RemoteService("http://fxcc.example:8000")
    assert isinstance(direct.http, http_client.Client)
