"""What the features hand the layers under them: a slot a lower layer reads and torchbuild.tasks fills.

No runtime or profile module may import a feature (pyproject's layers contract), yet some
things only a feature knows how to do: whether the toolchain image is current (its inputs, its
lock, its build: the image feature's), or whether a profile's NCCL stack is known-bad (the
comms feature's table). Each such thing is a Slot in the module that uses it; torchbuild.tasks,
which may import every feature, fills them all when it is imported.
Every entry point imports it before a task runs: invoke's tasks.py (the Collection `ns`), the
torchbuild console script and `python -m torchbuild` (cli.program), and so `torchbuild
inside.step` in the image and the SIF. A slot read before that is a wiring fault of torchbuild's
own, not a user's: RuntimeError naming the slot.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Slot(Generic[T]):
    """One thing a feature hands the runtime (torchbuild.tasks fills it, once, on import)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._value: list[T] = []

    def fill(self, value: T) -> None:
        self._value[:] = [value]

    def get(self) -> T:
        if not self._value:
            raise RuntimeError(f"{self.what} was not handed over: import torchbuild.tasks first")
        return self._value[0]
