"""The manifest: typed, versioned, written and read only by torchbuild.runtime.manifest, and the
`invoke manifest.show` / `invoke manifest.diff` tasks that read it."""

from __future__ import annotations

import copy
import errno
import importlib
import json
import os
import pkgutil
from pathlib import Path
from typing import Any

import pytest
from helpers import invoke_here

import torchbuild
from torchbuild import __version__
from torchbuild.builder.manifest_task import DIFFERENT
from torchbuild.core.errors import BuildFailed, InsufficientSpace, PathError, TorchbuildError
from torchbuild.profile.config import resolve
from torchbuild.runtime import manifest as mf

SPEC = resolve("cpu")
RUN = "0123456789ab"
COMMIT = "1eba9b3aa3c43f86f4a2c807ac8e12c4a7767340"
WHEEL_SHA = "5d" * 32

# Shaped like build._write_manifest's dict before the typed manifest (a wheel built in Docker).
OLD_WHEEL: dict[str, Any] = {
    "torchbuild_version": __version__,
    "kind": "wheel",
    "run_id": RUN,
    "profile": "cpu",
    "profile_hash": SPEC.hash,
    "resolved_profile": SPEC.to_dict(),
    "source": {
        "kind": "git",
        "path": "/src",
        "url": "https://github.com/pytorch/pytorch.git",
        "ref": "v2.6.0",
        "commit": COMMIT,
        "sha256": "",
        "submodules": [{"path": "third_party/pybind11", "commit": "a2e59f0e7065404b44dfe92a28aca47ba1378dc4"}],
    },
    "patches": {
        "series": "/opt/torchbuild/patches/pytorch/2.6.0",
        "checksum": "ab" * 32,
        "patches": [{"name": "01-cuda-aware-mpi-fallback.patch", "sha256": "cd" * 32}],
        "applied_now": ["01-cuda-aware-mpi-fallback.patch"],
        "already_applied": [],
    },
    "image": {"tag": SPEC.image_tag, "id": "sha256:" + "ef" * 32, "profile_hash": SPEC.hash},
    "engine": "docker",
    "toolchain": {
        "cc": "gcc (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0",
        "cxx": "g++ (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0",
        "python": "3.12.3",
        "cmake": "cmake version 3.28.3",
        "ninja": "1.11.1",
        "ccache": "ccache version 4.9.1",
    },
    "environment": {"CXXFLAGS": "-O2", "MAX_JOBS": "2", "CCACHE_DIR": "/cache/ccache"},
    "jobs": {
        "max_jobs": 2,
        "final_jobs": 1,
        "reason": "2 cores, 7.6 GiB available / 1.5 GiB per job",
        "nvcc_threads": 0,
        "retries": [
            {
                "step": "pip wheel",
                "jobs": 2,
                "next_jobs": 1,
                "evidence": "c++: fatal error: Killed signal terminated program cc1plus",
                "peak_rss_bytes": 1_300_000_000,
                "cgroup_peak_bytes": None,
                "seconds": 41.2,
            }
        ],
    },
    "started": "2025-03-01T10:00:00+00:00",
    "finished": "2025-03-01T11:40:00+00:00",
    "duration_s": 6000.0,
    "ccache": {"hits": 9, "misses": 1, "hit_rate": 0.9},
    "log": f"build-cpu-20250301-100000-{RUN}.log",
    "report": {"text": f"report-cpu-{RUN}.txt", "png": f"report-cpu-{RUN}.png"},
    "wheel": {"name": "torch-2.6.0-cp312-cp312-linux_x86_64.whl", "sha256": WHEEL_SHA, "size": 123_456},
}

# A native preflight: no image key, phases and canaries instead of a wheel.
OLD_PREFLIGHT: dict[str, Any] = {
    **{k: v for k, v in OLD_WHEEL.items() if k not in ("image", "wheel")},
    "kind": "preflight",
    "engine": "native",
    "preflight": {
        "targets": ["c10"],
        "canaries": [{"file": "csrc/ops.cpp", "seconds": 1.25, "peak_rss_bytes": 80_000_000}],
        "configure_s": 12.5,
        "targets_s": 30.1,
    },
}


def paths_of(data: Any) -> dict[str, Any]:
    return dict(mf.flatten(data))


def saved(tmp_path: Path, data: dict[str, Any], name: str = "a.manifest.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


invoke = invoke_here  # `invoke ARGV` in this process, its exit status


# --------------------------------------------------------------------------- shape


@pytest.mark.parametrize("old", [OLD_WHEEL, OLD_PREFLIGHT], ids=["wheel", "preflight"])
def test_every_key_and_value_of_the_old_dict_survives(old):
    m = mf.from_dict(old)
    new = m.to_dict()
    assert new["schema_version"] == 0  # written before versioning
    old_paths, new_paths = paths_of(old), paths_of(new)
    assert {p: new_paths.get(p, "MISSING") for p in old_paths} == old_paths
    assert list(new)[1:] == [k for k in new if k != "schema_version"]  # old keys keep their order
    assert ("image" in new) == ("image" in old)  # a native build still has no image key


def test_for_build_writes_what_the_old_writer_wrote(tmp_path):
    wheel = tmp_path / OLD_WHEEL["wheel"]["name"]
    wheel.write_bytes(b"PK\x05\x06" + bytes(18))
    m = mf.for_build(
        SPEC,
        run_id=RUN,
        provenance={k: OLD_WHEEL[k] for k in ("source", "patches", "image", "engine")},
        toolchain=OLD_WHEEL["toolchain"],
        environment=OLD_WHEEL["environment"],
        jobs=OLD_WHEEL["jobs"],
        started=OLD_WHEEL["started"],
        finished=OLD_WHEEL["finished"],
        seconds=5999.96,
        ccache=(9, 1, 0.9),
        log=OLD_WHEEL["log"],
        report=OLD_WHEEL["report"],
        wheel=wheel,
    )
    import hashlib

    expected = copy.deepcopy(OLD_WHEEL)
    expected["wheel"] = {"name": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(), "size": 22}
    new = paths_of(m.to_dict())
    assert {p: new.get(p, "MISSING") for p in paths_of(expected)} == paths_of(expected)
    assert m.schema_version == mf.SCHEMA_VERSION == new["schema_version"]


def test_for_build_of_a_preflight_without_provenance_is_native():
    m = mf.for_build(
        SPEC,
        run_id=RUN,
        provenance={},
        toolchain={},
        environment={},
        jobs={"max_jobs": 2, "final_jobs": 2, "reason": "2 cores", "nvcc_threads": 0, "retries": []},
        started="s",
        finished="f",
        seconds=1.0,
        ccache=(0, 0, 0.0),
        log="x.log",
        report=None,
        preflight={"targets": ["c10"], "canaries": [], "configure_s": 1.0},
    )
    assert m.kind == "preflight" and m.engine == "native" and m.preflight and m.preflight.targets_s is None
    assert not {"image", "source", "patches", "wheel"} & set(m.to_dict())


def test_image_record_from_labels_keeps_the_recorded_inputs():
    labels = {
        "org.torchbuild.profile-hash": SPEC.hash,
        "org.torchbuild.inputs-hash": "77" * 32,
        "org.torchbuild.base-image-id": "sha256:" + "11" * 32,
        "org.torchbuild.sif.image-id": "sha256:" + "22" * 32,
        "org.opencontainers.image.title": "torchbuild toolchain",
    }
    rec = mf.ImageRecord.from_labels(labels, tag=SPEC.image_tag, image_id="sha256:" + "22" * 32)
    assert rec.profile_hash == SPEC.hash and rec.tag == SPEC.image_tag
    assert rec.inputs == {"profile-hash": SPEC.hash, "inputs-hash": "77" * 32, "base-image-id": "sha256:" + "11" * 32}


def test_a_sif_manifest_written_before_schema_1_reads_its_image_id():
    old = {**OLD_WHEEL, "engine": "apptainer", "image": {"sif": "/x.sif", "image_id": "sha256:99", "profile_hash": "h"}}
    m = mf.from_dict(old)
    assert m.image == mf.ImageRecord(sif="/x.sif", id="sha256:99", profile_hash="h")


# --------------------------------------------------------------------------- files


@pytest.mark.parametrize("old", [OLD_WHEEL, OLD_PREFLIGHT], ids=["wheel", "preflight"])
def test_write_then_read_gives_the_same_manifest(tmp_path, old):
    m = mf.from_dict({**old, "schema_version": mf.SCHEMA_VERSION})
    path = mf.write(m, tmp_path / "x.manifest.json")
    assert mf.read(path) == m
    assert json.loads(path.read_text())["schema_version"] == mf.SCHEMA_VERSION
    assert [p.name for p in tmp_path.iterdir()] == ["x.manifest.json"]  # no temporary left


def test_a_failed_write_keeps_the_old_manifest_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = mf.write(mf.from_dict(OLD_WHEEL), tmp_path / "x.manifest.json")
    before = path.read_bytes()

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(InsufficientSpace, match="writing the manifest"):
        mf.write(mf.from_dict(OLD_PREFLIGHT), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.manifest.json"]


def test_writing_into_a_missing_directory_is_a_path_error(tmp_path):
    with pytest.raises(PathError, match="does not exist"):
        mf.write(mf.from_dict(OLD_WHEEL), tmp_path / "nope" / "x.manifest.json")


def _replace_in(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


def _drop(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


def _drop_in(data: dict[str, Any], record: str, key: str) -> dict[str, Any]:
    return {**data, record: _drop(data[record], key)}


BAD = {
    "missing file": (None, PathError, "does not exist"),
    "a directory": ("DIR", PathError, "is a directory"),
    "truncated": (json.dumps(OLD_WHEEL)[:300], mf.ManifestError, "not JSON .*truncated"),
    "empty": ("", mf.ManifestError, "not JSON"),
    "binary": (b"\x89PNG\r\n\x1a\n\xff\xfe", mf.ManifestError, "not UTF-8"),
    "foreign json": ({"name": "left-pad", "version": "1.3.0"}, mf.ManifestError, "not a torchbuild manifest"),
    "json list": ([OLD_WHEEL], mf.ManifestError, "not a torchbuild manifest"),
    "newer schema": (
        {**OLD_WHEEL, "schema_version": mf.SCHEMA_VERSION + 1},
        mf.ManifestError,
        f"manifest schema {mf.SCHEMA_VERSION + 1}; this torchbuild .* reads schema {mf.SCHEMA_VERSION} and older",
    ),
    "schema not a number": ({**OLD_WHEEL, "schema_version": "1"}, mf.ManifestError, "not a version number"),
    "wrong type": (_replace_in(OLD_WHEEL, "jobs.max_jobs", "two"), mf.ManifestError, "jobs.max_jobs: expected an int"),
    "bool for int": (_replace_in(OLD_WHEEL, "wheel.size", True), mf.ManifestError, "wheel.size: expected an int"),
    "list for object": (_replace_in(OLD_WHEEL, "ccache", [1, 2]), mf.ManifestError, "ccache: expected an object"),
    "unknown field": ({**OLD_WHEEL, "colour": "blue"}, mf.ManifestError, "manifest: .*unknown keys colour"),
    "unknown nested field": (
        _replace_in(OLD_WHEEL, "jobs.retries", [{**OLD_WHEEL["jobs"]["retries"][0], "colour": "blue"}]),
        mf.ManifestError,
        r"jobs\.retries\[0\] has unknown keys colour",
    ),
    "missing field": (_drop(OLD_WHEEL, "jobs"), mf.ManifestError, "manifest: jobs: missing"),
    "missing nested field": (_drop_in(OLD_WHEEL, "wheel", "sha256"), mf.ManifestError, "wheel.sha256: missing"),
    "string for a list": (
        _replace_in(OLD_WHEEL, "patches.applied_now", "01.patch"),
        mf.ManifestError,
        "patches.applied_now: expected a list, found a string",
    ),
    "number for a string": (
        _replace_in(OLD_WHEEL, "toolchain", {"cc": 13}),
        mf.ManifestError,
        "toolchain.cc: expected a string, found a number 13",
    ),
    "wheel and preflight": (
        {**OLD_WHEEL, "preflight": OLD_PREFLIGHT["preflight"]},
        mf.ManifestError,
        "exactly one of wheel and preflight",
    ),
    "unknown engine": ({**OLD_WHEEL, "engine": "podman"}, mf.ManifestError, "engine: 'podman'"),
}


@pytest.mark.parametrize(("content", "error", "message"), BAD.values(), ids=BAD.keys())
def test_a_bad_manifest_file_is_a_named_error(tmp_path, content, error, message):
    path = tmp_path / "x.manifest.json"
    if content == "DIR":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_text(json.dumps(content))
    with pytest.raises(error, match=message) as caught:
        mf.read(path)
    assert str(path) in caught.value.message and caught.value.hint


def test_a_newer_schema_says_to_upgrade(tmp_path):
    newer = mf.SCHEMA_VERSION + 1
    path = saved(tmp_path, {**OLD_WHEEL, "torchbuild_version": "9.0", "schema_version": newer})
    with pytest.raises(mf.ManifestError, match=rf"written by torchbuild 9\.0 with manifest schema {newer}") as caught:
        mf.read(path)
    assert "upgrade torchbuild" in caught.value.hint


def test_manifest_path_names_the_wheel_or_the_preflight_run(tmp_path):
    assert mf.manifest_path(tmp_path, "t.whl", "cpu", RUN) == tmp_path / "t.whl.manifest.json"
    assert mf.manifest_path(tmp_path, None, "cpu", RUN) == tmp_path / f"preflight-cpu-{RUN}.manifest.json"


def test_find_run_picks_its_own_manifest_and_skips_others(tmp_path):
    saved(tmp_path, {**OLD_WHEEL, "run_id": "ffffffffffff"}, "other.whl.manifest.json")
    (tmp_path / "broken.whl.manifest.json").write_text('{"run_id": "eeeeeeeeeeee", ')  # another run's, cut short
    mine = saved(tmp_path, OLD_PREFLIGHT, f"preflight-cpu-{RUN}.manifest.json")
    m, path = mf.find_run(tmp_path, RUN)
    assert path == mine and m.run_id == RUN and m.kind == "preflight"
    with pytest.raises(BuildFailed, match="wrote no manifest for run 000000000000"):
        mf.find_run(tmp_path, "000000000000")


# --------------------------------------------------------------------------- diff and show


def _rebuilt(cxxflags: str, run_id: str) -> dict[str, Any]:
    data = _replace_in(OLD_WHEEL, "resolved_profile.cxxflags", [cxxflags])
    data = _replace_in(data, "environment.CXXFLAGS", cxxflags)
    return {**data, "run_id": run_id, "started": "2025-03-02T10:00:00+00:00", "duration_s": 1.5}


def test_diff_finds_a_changed_cxxflags_and_ignores_per_run_fields():
    a, b = mf.from_dict(OLD_WHEEL), mf.from_dict(_rebuilt("-O3", "ffffffffffff"))
    assert [(d.path, d.a, d.b) for d in mf.diff(a, b)] == [
        ("resolved_profile.cxxflags", [], ["-O3"]),
        ("environment.CXXFLAGS", "-O2", "-O3"),
    ]
    everything = {d.path for d in mf.diff(a, b, everything=True)}
    assert {"run_id", "started", "duration_s", "resolved_profile.cxxflags"} <= everything
    assert mf.diff(a, a) == []


def test_diff_names_nested_and_absent_fields():
    a = mf.from_dict(OLD_WHEEL)
    b = mf.from_dict(
        {
            **_replace_in(OLD_WHEEL, "jobs.retries", []),
            "engine": "native",
            "image": None,
            "source": {**OLD_WHEEL["source"], "commit": "0" * 40},
        }
    )
    found = {d.path: (d.a, d.b) for d in mf.diff(a, b)}
    assert found["source.commit"] == (COMMIT, "0" * 40)
    assert found["image.id"] == (OLD_WHEEL["image"]["id"], mf.ABSENT)
    assert found["jobs.retries[0].evidence"][1] == mf.ABSENT
    assert "jobs.retries[0].seconds" not in found  # a timing: per run


def test_show_prints_commit_wheel_sha256_and_every_profile_key():
    text = mf.show(mf.from_dict(OLD_WHEEL))
    for needle in (COMMIT, WHEEL_SHA, OLD_WHEEL["image"]["id"], "g++ (Ubuntu", "CCACHE_DIR", "01-cuda-aware-mpi"):
        assert needle in text
    lines = text.splitlines()
    for key in SPEC.to_dict():
        assert any(line.split()[:1] == [key] for line in lines), key
    assert "OOM retries" in text and "90% (9 hits, 1 misses)" in text


def test_show_of_a_preflight_lists_its_canaries():
    text = mf.show(mf.from_dict(OLD_PREFLIGHT))
    assert "csrc/ops.cpp" in text and "76 MiB" in text and "none (native build)" in text


# --------------------------------------------------------------------------- the tasks, through invoke's parser


def test_invoke_manifest_diff_exit_status_and_output(tmp_path, capsys):
    a = saved(tmp_path, OLD_WHEEL, "a.manifest.json")
    same = saved(tmp_path, {**OLD_WHEEL, "run_id": "ffffffffffff", "finished": "later"}, "same.manifest.json")
    b = saved(tmp_path, _rebuilt("-O3", "ffffffffffff"), "b.manifest.json")

    assert invoke("manifest.diff", str(a), str(same)) == 0
    assert capsys.readouterr().out.startswith("identical")

    assert invoke("manifest.diff", str(a), str(b)) == DIFFERENT
    out = capsys.readouterr().out
    assert "resolved_profile.cxxflags" in out and "environment.CXXFLAGS" in out and "run_id" not in out
    assert "2 fields differ" in out

    assert invoke("manifest.diff", "--all", str(a), str(same)) == DIFFERENT
    assert "run_id" in capsys.readouterr().out


def test_invoke_manifest_errors_are_named_without_traceback(tmp_path, capsys):
    foreign = saved(tmp_path, {"name": "left-pad"}, "package.json")
    assert invoke("manifest.show", str(foreign)) == mf.ManifestError.exit_code == 19
    err = capsys.readouterr().err
    assert err.startswith("error: ManifestError: ") and "hint: " in err and "Traceback" not in err
    assert invoke("manifest.diff", str(tmp_path / "nope.json"), str(foreign)) == PathError.exit_code


def test_invoke_manifest_show_prints_the_build(tmp_path, capsys):
    assert invoke("manifest.show", str(saved(tmp_path, OLD_WHEEL))) == 0
    out = capsys.readouterr().out
    assert COMMIT in out and WHEEL_SHA in out


def test_differ_status_is_no_error_s_exit_code():
    for info in pkgutil.walk_packages(torchbuild.__path__, "torchbuild."):
        importlib.import_module(info.name)

    def every(cls: type[TorchbuildError]) -> list[type[TorchbuildError]]:
        return [cls, *(c for sub in cls.__subclasses__() for c in every(sub))]

    codes = {c.exit_code for c in every(TorchbuildError)}
    assert DIFFERENT not in codes | {0, 1}  # 1: invoke's own for a bad option, and Python's
