"""The integration suite's shared images, built before its first test, two at a time.

On a new machine most of the suite's time is image builds (debootstrap, apt, pip), each mostly
one core's work or a download. The session fixtures that make them (tests/integration/conftest.py)
are started together here, as soon as the session knows which of them its selected tests need,
on two threads: one build's downloads and single-threaded unpacking overlap another's. Each
fixture then takes its build's result (or builds now, when nothing started it). Every build
still goes through the product's own code or the CLI a user types; a failed build fails the
tests that need it, as before, and nothing else. Nothing runs beside the tests themselves: the
first test starts when every build has ended.

Dependencies are submitted before what needs them: with first-in first-out threads, a build
that waits for another waits for one that is running or done, never for one still queued.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

WORKERS = 2  # CI's machines have 2 cores


class Builds:
    """name -> the future of its build; results are kept for the session."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="image-build")
        self._futures: dict[str, concurrent.futures.Future[Any]] = {}
        self._ended: dict[str, tuple[float, float]] = {}  # name -> (started, ended), from the first start
        self._t0 = 0.0
        self._lock = threading.Lock()

    def start(self, name: str, build: Callable[[], Any]) -> None:
        """Queue build under name (once)."""
        with self._lock:
            if not self._futures:
                self._t0 = time.monotonic()
            if name not in self._futures:
                self._futures[name] = self._pool.submit(self._timed, name, build)

    def _timed(self, name: str, build: Callable[[], Any]) -> Any:
        started = time.monotonic() - self._t0
        try:
            return build()
        finally:
            self._ended[name] = (started, time.monotonic() - self._t0)

    def get(self, name: str, build: Callable[[], Any]) -> Any:
        """The result of name's build: the queued one's (its exception raised here), or build()
        run now when none was queued."""
        with self._lock:
            future = self._futures.get(name)
        return build() if future is None else future.result()

    def wait(self, names: Iterable[str] | None = None) -> list[str]:
        """Wait for the queued builds (all, or names); one line per build: when it started and ended
        (seconds from the first start; a build waiting for another counts that wait), or its error."""
        with self._lock:
            chosen = {n: f for n, f in self._futures.items() if names is None or n in names}
        lines = []
        for name, future in chosen.items():
            error = future.exception()
            started, ended = self._ended.get(name, (0.0, 0.0))
            when = f"{started:.0f} s to {ended:.0f} s"
            lines.append(f"{name}: {when}" if error is None else f"{name}: {when}, failed: {error!s:.200}")
        return lines

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


# the integration session's builds: conftest.py queues them, the fixtures and test modules take them
BUILDS = Builds()
