"""Every local check of a task before anything slow, and all their failures in one error.

A task checks what it can here and cheaply (its options, the paths it was given, the engine,
the tools) before it clones, downloads or compiles, and names every problem at once: a user
who fixes one is not sent back for the next after a clone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torchbuild.core.errors import TorchbuildError

T = TypeVar("T")


class Problems:
    """The failed checks of a task so far; `raise_any()` raises them as one error."""

    def __init__(self) -> None:
        self.found: list[TorchbuildError] = []

    def check(self, fn: Callable[[], T]) -> T | None:
        """fn's result, or None when it raised a named error (kept for raise_any)."""
        try:
            return fn()
        except TorchbuildError as exc:
            self.found.append(exc)
            return None

    def add(self, exc: TorchbuildError) -> None:
        self.found.append(exc)

    def raise_any(self) -> None:
        """Nothing when every check passed; the one error; or, for several, an error of the
        first one's class (its exit code) listing each with its own hint."""
        if not self.found:
            return
        if len(self.found) == 1:
            raise self.found[0]
        first = self.found[0]
        lines = [f"{len(self.found)} problems, all found before anything was fetched or built:"]
        lines += [f"  - {type(e).__name__}: {e.message} (hint: {e.hint})" for e in self.found]
        raise type(first)("\n".join(lines), hint="fix each problem listed, then run the same command again")
