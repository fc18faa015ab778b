"""The disk peak of a job that drives the host's engine (`nox -s gha -- integration`).

A thread beside the act run samples, every 10 s, the engine's disk use as `docker system df`
counts it (images, containers' writable layers, volumes, build cache: the API's /system/df, in
bytes) and the used space of the file systems holding Docker's data root and /tmp, and reads
the engine's events since the last sample (the images the job's containers ran and the images
it tagged). At the end it prints the peak and when it happened, and, because this engine
already holds the suite's images, an estimate of what a fresh hosted runner would need: the
size of the layers of the images the job used whose names are the suite's (torchbuild/*,
torchbuild-test/*; shared layers counted once) plus the peak growth of /tmp.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

SUITE_REPOS = ("torchbuild/", "torchbuild-test/")
GB = 1e9


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # seconds since the sampler started
    images: int  # bytes: the layers of all images (LayersSize)
    containers: int  # bytes: the containers' writable layers
    volumes: int
    build_cache: int
    fs_used: tuple[tuple[str, int], ...] = ()  # (path, used bytes) of each file system sampled

    @property
    def engine(self) -> int:
        return self.images + self.containers + self.volumes + self.build_cache

    def used(self, path: str) -> int:
        return dict(self.fs_used).get(path, 0)


def engine_usage(df: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(images, containers, volumes, build cache) bytes from the API's /system/df answer, as
    `docker system df` totals them (a size of -1 means not computed: counted as 0)."""
    images = int(df.get("LayersSize") or 0)
    containers = sum(max(int(c.get("SizeRw") or 0), 0) for c in df.get("Containers") or [])
    volumes = sum(max(int((v.get("UsageData") or {}).get("Size", 0) or 0), 0) for v in df.get("Volumes") or [])
    cache = sum(int(b.get("Size") or 0) for b in df.get("BuildCache") or [] if not b.get("Shared"))
    return images, containers, volumes, cache


def fs_used(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def refs_from_events(events: Iterable[Mapping[str, Any]]) -> set[str]:
    """The image names (or ids) in engine events: the image each created container ran, and
    each image tagged, imported, pulled or loaded."""
    refs: set[str] = set()
    for ev in events:
        attrs = (ev.get("Actor") or {}).get("Attributes") or {}
        kind, action = ev.get("Type"), ev.get("Action") or ev.get("status")
        if kind == "container" and action == "create" and attrs.get("image"):
            refs.add(str(attrs["image"]))
        elif kind == "image" and action in ("tag", "import", "pull", "load"):
            name = attrs.get("name") or (ev.get("Actor") or {}).get("ID")
            if name:
                refs.add(str(name))
    return refs


def is_suite_image(tags: Sequence[str]) -> bool:
    return any(t.startswith(SUITE_REPOS) for t in tags)


def layer_sizes(layers: Sequence[str], history: Sequence[Mapping[str, Any]]) -> dict[tuple[str, ...], int]:
    """{layer chain: bytes} for one image: its RootFS layers (oldest first) paired, oldest
    first, with the history entries (the API lists them newest first) that may have made a
    layer: all but the size-0 `#(nop)` metadata steps. An empty layer the history does not show
    shifts the pairing of the entries after it, but never a size (it has none), and images with
    a common parent pair their common part alike, so shared layers still match. Keys are
    chains (the layer and every layer under it), as the engine stores layers; when the history
    names more layers than there are, the image counts as one."""
    made = [int(h.get("Size") or 0) for h in reversed(history) if _made_layer(h)]
    if len(made) > len(layers):
        return {tuple(layers): sum(int(h.get("Size") or 0) for h in history)}
    return {tuple(layers[: i + 1]): size for i, size in enumerate(made)}


def _made_layer(h: Mapping[str, Any]) -> bool:
    return not (int(h.get("Size") or 0) == 0 and "#(nop)" in str(h.get("CreatedBy") or ""))


def union_size(per_image: Iterable[Mapping[tuple[str, ...], int]]) -> int:
    """The bytes of the layers of several images, each shared layer counted once."""
    seen: dict[tuple[str, ...], int] = {}
    for sizes in per_image:
        seen.update(sizes)
    return sum(seen.values())


def peak(samples: Sequence[Sample], key: Callable[[Sample], int]) -> Sample:
    return max(samples, key=key)


def clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def report(samples: Sequence[Sample], suite_images: int, paths: Sequence[str]) -> list[str]:
    """The lines printed at the end: the engine's peak (and its parts then), each file system's
    peak and growth, and the fresh runner's estimate."""
    if not samples:
        return ["disk: no sample was taken"]
    first = samples[0]
    top = peak(samples, lambda s: s.engine)
    lines = [
        f"disk: {len(samples)} samples; engine peak {top.engine / GB:.1f} GB at +{clock(top.at)} "
        f"(images {top.images / GB:.1f}, containers {top.containers / GB:.1f}, volumes {top.volumes / GB:.1f}, "
        f"build cache {top.build_cache / GB:.1f}); at the start {first.engine / GB:.1f} GB"
    ]
    for path in paths:
        p = peak(samples, lambda s, path=path: s.used(path))  # type: ignore[misc]
        grow = p.used(path) - first.used(path)
        lines.append(f"disk: {path}: used peak {p.used(path) / GB:.1f} GB at +{clock(p.at)}, growth {grow / GB:.1f} GB")
    tmp_growth = max(s.used("/tmp") for s in samples) - first.used("/tmp") if "/tmp" in paths else 0
    lines.append(
        f"disk: a fresh hosted runner would need about {(suite_images + tmp_growth) / GB:.1f} GB: the suite's images "
        f"{suite_images / GB:.1f} GB (torchbuild/*, torchbuild-test/* used in the run, shared layers once) "
        f"+ /tmp's peak growth {tmp_growth / GB:.1f} GB"
    )
    return lines


class Sampler:
    """Samples the engine (a docker-py client) and the file systems every interval seconds in a
    thread; stop() returns the report's lines."""

    def __init__(self, client: Any, interval: float = 10.0, paths: Sequence[str] = ()) -> None:
        self.client = client
        self.interval = interval
        root = str((client.info() or {}).get("DockerRootDir") or "/var/lib/docker")
        self.paths = list(dict.fromkeys([*paths, root, "/tmp"]))
        self.samples: list[Sample] = []
        self.refs: set[str] = set()
        self._stop = threading.Event()
        self._start = time.time()
        self._since = int(self._start)
        self._thread = threading.Thread(target=self._loop, name="disk-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def sample(self) -> None:
        now = int(time.time())
        events = self.client.events(since=self._since, until=now, decode=True)
        self.refs |= refs_from_events(events)
        self._since = now
        usage = engine_usage(self.client.df())
        used = tuple((p, fs_used(p)) for p in self.paths if os.path.exists(p))
        self.samples.append(Sample(time.time() - self._start, *usage, fs_used=used))

    def _loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception as exc:  # a failed sample is reported, never stops the job
                print(f"disk: sample failed: {exc}", flush=True)
            if self._stop.wait(self.interval):
                return

    def suite_images(self) -> int:
        per_image = []
        for ref in sorted(self.refs):
            try:
                attrs = self.client.api.inspect_image(ref)
            except Exception:  # removed during the run (a test's throwaway image): not counted
                continue
            if not is_suite_image(attrs.get("RepoTags") or [ref]):
                continue
            layers = (attrs.get("RootFS") or {}).get("Layers") or []
            per_image.append(layer_sizes(layers, self.client.api.history(attrs["Id"])))
        return union_size(per_image)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        try:
            self.sample()
        except Exception as exc:
            print(f"disk: last sample failed: {exc}", flush=True)
        return report(self.samples, self.suite_images(), self.paths)
