"""Fixtures of the data_scripts tests: the local HTTP server, no waiting between retries."""

import threading
from http.server import ThreadingHTTPServer

import pytest

from tests.data_scripts.fakes import Server, handler


@pytest.fixture
def server(tmp_path) -> Server:
    """An HTTP server on 127.0.0.1 (a free port) serving `tmp_path / "served"`."""
    served = Server(tmp_path / "served")
    served.root.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler(served))
    served.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield served
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch):
    import _download

    monkeypatch.setattr(_download, "RETRY_WAIT", 0.0)
