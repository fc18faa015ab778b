"""What a build request has already finished, so that running it again (a resubmitted batch
job, `invoke build --resume`) skips those steps instead of redoing them.

A request is keyed by its hash: the profile's build keys, the source and ref as given, what is
built (a wheel, or preflight targets and canaries) and the backend. Its record lives in the
output directory, `<out>/.torchbuild/done/<key>.json`, and gains an entry as each step ends:

    source   the tree was fetched (or unpacked) and the patch series applied
    wheel    the build step wrote a wheel (or passed its preflight) and its manifest
    verify   the wheel passed `verify` where it was built

A step is skipped only while what it made is still there and unchanged: the tree exists and the
patch series has the same checksum; the wheel's sha256 matches its manifest; the verify report
names that wheel. Configure is skipped by the build step itself (build/torchbuild-configure.json:
same inputs, finished) and says so in the build log.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchbuild.core.atomic import EXCHANGE, atomic_write_text
from torchbuild.core.errors import named_os_errors

STEPS = ("source", "wheel", "verify")


def request_key(
    spec_hash: str,
    source: str,
    ref: str,
    *,
    preflight: bool,
    targets: Sequence[str],
    canaries: Sequence[str],
    backend: str,
    python: str = "",
) -> str:
    """The hash that names a build request across runs (24 hex digits); a wheel for another
    Python (`--python`) is another request. Without one the key is what it was before."""
    blob = json.dumps(
        {
            "spec": spec_hash,
            "source": source,
            "ref": ref,
            "preflight": preflight,
            "targets": list(targets),
            "canaries": list(canaries),
            "backend": backend,
            **({"python": python} if python else {}),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def record_path(out_dir: Path, key: str) -> Path:
    return Path(out_dir) / EXCHANGE / "done" / f"{key}.json"


@dataclasses.dataclass
class Record:
    """The steps one request has finished, with what each left behind."""

    path: Path
    key: str
    steps: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def load(cls, out_dir: Path, key: str) -> Record:
        """The record of key in out_dir; an unreadable or foreign one counts as nothing done."""
        path = record_path(out_dir, key)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls(path, key)
        steps = data.get("steps") if isinstance(data, dict) and data.get("key") == key else None
        if not isinstance(steps, dict):
            return cls(path, key)
        return cls(path, key, {k: v for k, v in steps.items() if k in STEPS and isinstance(v, dict)})

    @classmethod
    def off(cls) -> Record:
        """The record of a run that does not resume: nothing done, nothing written."""
        return cls(Path(os.devnull), "")

    def get(self, step: str) -> Mapping[str, Any] | None:
        return self.steps.get(step)

    def done(self, step: str, **facts: Any) -> None:
        """Record that step finished (written at once: a job killed after it keeps it)."""
        if not self.key:
            return
        self.steps[step] = {**facts, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with named_os_errors(self.path, "recording the finished steps"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps({"key": self.key, "steps": self.steps}, indent=2) + "\n")

    def forget(self, *steps: str) -> None:
        """Drop steps whose results are gone, so a later step is not believed either."""
        for step in steps:
            self.steps.pop(step, None)
