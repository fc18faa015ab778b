"""The documentation site as a reader gets it: `mkdocs build --strict` of docs/, served on
127.0.0.1 by http.server in a thread, and opened in real headless Chromium (Debian's `chromium`;
.ci/run installs it).

- The built reference pages list every profile key of configs/defaults.yaml and every named
  error of core/errors.py with its exit code (the hook generates them; this is the check that
  it did, in the HTML a reader gets).
- The quick start renders: Chromium's --dump-dom of the page has its heading and the `./tb`
  command.
- The search finds a profile key: Material's search runs in a web worker over
  search/search_index.json, and fills its result list from the `?q=` of the URL. `--dump-dom
  --virtual-time-budget` dumps before the worker has answered (virtual time does not wait for a
  worker), so the page is driven over the Chrome DevTools protocol instead (websocket-client from
  PyPI): navigate to `/?q=ccache_remote`, then read the result list from the live DOM until the
  worker has filled it. The list must name the key reference page.
"""

from __future__ import annotations

import contextlib
import functools
import html.parser
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import REPO

from torchbuild.core.errors import ERRORS
from torchbuild.profile.config import schema

KEY = "ccache_remote"


class _Text(html.parser.HTMLParser):
    """The text of an HTML document, as a reader sees it (no tags, entities decoded)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def text_of(markup: str) -> str:
    parser = _Text()
    parser.feed(markup)
    return "".join(parser.parts)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def chromium() -> list[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("the docs test needs Chromium: apt-get install -y chromium (.ci/run installs it)")
    args = [exe, "--headless", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
    return args


def test_the_built_reference_lists_every_profile_key_and_error(site: Path) -> None:
    page = (site / "reference" / "profile-keys" / "index.html").read_text()
    rows = re.findall(r"<tr>\s*<td><code>(\w+)</code></td>", page)  # a row's first cell: its key
    missing = [k for k in schema() if k not in rows]
    assert not missing, f"keys missing from the built key reference: {missing}"
    assert sorted(rows) == sorted(schema()), "the key reference lists a key twice, or one that is not a key"
    errors = (site / "reference" / "errors" / "index.html").read_text()
    rows = dict(re.findall(r"<td><code>(\w+)</code></td>\s*<td>(\d+)</td>", errors))
    assert rows == {c.__name__: str(c.exit_code) for c in ERRORS}


def test_the_quick_start_renders_in_chromium(served: str, chromium: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [*chromium, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"{served}/quickstart/"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    heading = re.search(r"<h1[^>]*>(.*?)</h1>", done.stdout, re.S)
    assert heading and text_of(heading[1]).strip().startswith("Quick start"), done.stdout[:2000]
    page = text_of(done.stdout)
    assert "./tb image build --in-container" in page
    assert "sudo bash .ci/run" in page


@contextlib.contextmanager
def devtools(chromium: list[str], profile: Path) -> Iterator[str]:
    """Chromium with the DevTools protocol on a free port: the websocket URL of its page."""
    proc = subprocess.Popen(
        [*chromium, "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            assert proc.poll() is None, f"chromium exited with {proc.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port in 60 s"
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            pages = [t for t in json.load(answer) if t["type"] == "page"]
        yield pages[0]["webSocketDebuggerUrl"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Page:
    """One page over the DevTools protocol: a command and its result, events skipped."""

    def __init__(self, url: str) -> None:
        import websocket  # websocket-client: the protocol's JSON messages over a websocket

        self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: object) -> dict:
        ident = next(self.ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                assert "error" not in message, message
                return message["result"]

    def evaluate(self, expression: str) -> object:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


RESULTS = """JSON.stringify({
  meta: (document.querySelector('.md-search-result__meta') || {}).textContent || '',
  items: [...document.querySelectorAll('.md-search-result__item a')].map(a => [a.href, a.innerText])
})"""


def test_the_search_finds_a_profile_key(served: str, chromium: list[str], tmp_path: Path) -> None:
    with devtools(chromium, tmp_path / "profile") as url:
        page = Page(url)
        page.call("Page.enable")
        page.call("Page.navigate", url=f"{served}/?q={KEY}")
        deadline = time.monotonic() + 60
        found: dict = {"meta": "", "items": []}
        while time.monotonic() < deadline:
            found = json.loads(str(page.evaluate(RESULTS)))
            if found["items"]:
                break
            time.sleep(0.5)
        page.ws.close()
    assert found["items"], f"no search results for {KEY} in 60 s: {found}"
    assert re.search(r"\d+ matching document", found["meta"]), found["meta"]
    # a result's link carries the highlight (?h=) and the section (#...): the page is the rest
    pages = {urllib.parse.urlsplit(href)._replace(query="", fragment="").geturl() for href, _ in found["items"]}
    assert f"{served}/reference/profile-keys/" in pages, found["items"]
    assert any(KEY in text for _, text in found["items"]), found["items"]
