"""The disk sampler of `nox -s gha -- integration` (.ci/gha/disk.py): the engine's usage from
/system/df, the images named by the engine's events, shared layers counted once, the peak and
its time, and the fresh runner's estimate (no engine here: recorded answers and a stand-in
client)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GB = 10**9


def _load():
    spec = importlib.util.spec_from_file_location("gha_disk", ROOT / ".ci" / "gha" / "disk.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gha_disk"] = module
    spec.loader.exec_module(module)
    return module


disk = _load()

# the shape of the engine's /system/df answer (Docker 20.10), trimmed to the fields read
DF = {
    "LayersSize": 40 * GB,
    "Images": [{"Id": "sha256:a", "Size": 2 * GB, "SharedSize": GB, "RepoTags": ["torchbuild/base:trixie-x86_64"]}],
    "Containers": [{"Id": "c1", "SizeRw": 3 * GB}, {"Id": "c2", "SizeRw": -1}, {"Id": "c3"}],
    "Volumes": [{"Name": "v1", "UsageData": {"Size": GB, "RefCount": 1}}, {"Name": "v2", "UsageData": {"Size": -1}}],
    "BuildCache": [{"ID": "b1", "Size": 2 * GB, "Shared": False}, {"ID": "b2", "Size": 5 * GB, "Shared": True}],
}


def test_engine_usage_totals_as_docker_system_df_does():
    assert disk.engine_usage(DF) == (40 * GB, 3 * GB, GB, 2 * GB)  # -1 (not computed) and shared cache: 0
    assert disk.engine_usage({}) == (0, 0, 0, 0)


def test_the_images_a_run_used_come_from_container_creates_and_image_tags():
    events = [
        {
            "Type": "container",
            "Action": "create",
            "Actor": {"ID": "c1", "Attributes": {"image": "torchbuild/toolchain:cpu"}},
        },
        {"Type": "container", "Action": "start", "Actor": {"ID": "c1", "Attributes": {"image": "ignored:start"}}},
        {
            "Type": "image",
            "Action": "tag",
            "Actor": {"ID": "sha256:b", "Attributes": {"name": "torchbuild-test/slurm-nodes:x"}},
        },
        {"Type": "image", "Action": "import", "Actor": {"ID": "sha256:c", "Attributes": {}}},
        {"Type": "network", "Action": "create", "Actor": {"ID": "n", "Attributes": {"name": "net"}}},
    ]
    assert disk.refs_from_events(events) == {"torchbuild/toolchain:cpu", "torchbuild-test/slurm-nodes:x", "sha256:c"}


def test_only_the_suites_repositories_count():
    assert disk.is_suite_image(["torchbuild/base:noble-x86_64"])
    assert disk.is_suite_image(["other:1", "torchbuild-test/redis:trixie"])
    assert not disk.is_suite_image(["torchbuild-gha/runner:ubuntu-24.04"])
    assert not disk.is_suite_image(["ubuntu:24.04"])


def _history(*entries: tuple[int, str]) -> list[dict[str, object]]:
    # the API lists history newest first; entries are given oldest first here
    return [{"Size": size, "CreatedBy": by} for size, by in reversed(entries)]


BASE = ["L1"]
BASE_HISTORY = [(100, "ADD rootfs.tar /"), (0, "/bin/sh -c #(nop)  CMD [bash]")]


def test_layers_pair_with_the_history_that_made_them_and_shared_layers_count_once():
    child_a = disk.layer_sizes([*BASE, "A2"], _history(*BASE_HISTORY, (0, "#(nop) ENV X=1"), (30, "RUN a")))
    child_b = disk.layer_sizes([*BASE, "B2", "B3"], _history(*BASE_HISTORY, (20, "RUN b"), (5, "RUN c")))
    assert child_a == {("L1",): 100, ("L1", "A2"): 30}
    assert sum(child_b.values()) == 125
    assert disk.union_size([child_a, child_b]) == 100 + 30 + 20 + 5  # the base once, not twice


def test_an_empty_layer_missing_from_the_history_never_changes_an_images_size():
    sizes = disk.layer_sizes(["L1", "E", "L3"], _history((100, "ADD rootfs.tar /"), (7, "RUN x")))
    assert sum(sizes.values()) == 107


def test_a_history_with_more_layers_than_the_image_counts_the_image_as_one():
    sizes = disk.layer_sizes(["L1"], _history((100, "ADD a"), (7, "RUN x")))
    assert sizes == {("L1",): 107}


def _sample(at: float, images: int, tmp: int, root: int = 0, containers: int = 0) -> object:
    return disk.Sample(at, images, containers, 0, 0, fs_used=(("/var/lib/docker", root), ("/tmp", tmp)))


def test_the_report_gives_the_peak_its_time_and_the_fresh_runners_estimate():
    samples = [
        _sample(0, 40 * GB, 10 * GB, 50 * GB),
        _sample(610, 44 * GB, 13 * GB, 58 * GB, containers=2 * GB),  # the peak, at 10:10
        _sample(1200, 41 * GB, 11 * GB, 52 * GB),
    ]
    lines = disk.report(samples, suite_images=22 * GB, paths=["/var/lib/docker", "/tmp"])
    assert "engine peak 46.0 GB at +10:10" in lines[0] and "at the start 40.0 GB" in lines[0]
    assert "containers 2.0" in lines[0]
    assert lines[1] == "disk: /var/lib/docker: used peak 58.0 GB at +10:10, growth 8.0 GB"
    assert lines[2] == "disk: /tmp: used peak 13.0 GB at +10:10, growth 3.0 GB"
    assert "about 25.0 GB" in lines[3] and "images 22.0 GB" in lines[3] and "growth 3.0 GB" in lines[3]


def test_no_samples_is_said_not_a_crash():
    assert disk.report([], suite_images=0, paths=["/tmp"]) == ["disk: no sample was taken"]


class _Api:
    def __init__(self) -> None:
        self.images = {
            "torchbuild/toolchain:cpu": {
                "Id": "sha256:t",
                "RepoTags": ["torchbuild/toolchain:cpu"],
                "RootFS": {"Layers": ["L1", "T2"]},
            },
            "torchbuild-gha/runner:x": {
                "Id": "sha256:r",
                "RepoTags": ["torchbuild-gha/runner:x"],
                "RootFS": {"Layers": ["R1"]},
            },
        }
        self.histories = {"sha256:t": _history((100, "ADD"), (50, "RUN")), "sha256:r": _history((999, "ADD"))}

    def inspect_image(self, ref: str) -> dict[str, object]:
        if ref not in self.images:
            raise LookupError(ref)
        return self.images[ref]

    def history(self, image_id: str) -> list[dict[str, object]]:
        return self.histories[image_id]


class _Client:
    """Stands in for docker-py's client: the engine's answers for one run."""

    def __init__(self, tmp_root: str) -> None:
        self.api = _Api()
        self.root = tmp_root
        self.dfs = [dict(DF, LayersSize=40 * GB), dict(DF, LayersSize=45 * GB)]

    def info(self) -> dict[str, str]:
        return {"DockerRootDir": self.root}

    def df(self) -> dict[str, object]:
        return self.dfs.pop(0) if len(self.dfs) > 1 else self.dfs[0]

    def events(self, since: int, until: int, decode: bool) -> list[dict[str, object]]:
        create = {"Type": "container", "Action": "create", "Actor": {"Attributes": {"image": ""}}}
        refs = ["torchbuild/toolchain:cpu", "torchbuild-gha/runner:x", "torchbuild-test/gone:1"]
        return [{**create, "Actor": {"Attributes": {"image": r}}} for r in refs]


def test_the_sampler_samples_until_stopped_and_counts_only_the_suites_images_still_there(tmp_path):
    sampler = disk.Sampler(_Client(str(tmp_path)), interval=0.01).start()
    lines = sampler.stop()
    assert len(sampler.samples) >= 2 and sampler.paths == [str(tmp_path), "/tmp"]
    assert sampler.suite_images() == 150  # the toolchain; the runner is not the suite's, the gone one is gone
    assert "engine peak 51.0 GB" in lines[0]
