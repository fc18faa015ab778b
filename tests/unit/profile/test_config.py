from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import TEST_TORCH

from torchbuild.core.arch import Arch
from torchbuild.core.errors import ProfileError
from torchbuild.profile.config import BuildSpec, available_profiles, resolve, schema
from torchbuild.runtime.environment import build_env

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "profiles"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_buildspec_fields_are_exactly_the_declared_keys():
    fields = {f.name for f in dataclasses.fields(BuildSpec)} - {"profile", "origins"}
    assert fields == set(schema())


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_resolves_and_documents_itself(name):
    spec = resolve(name, host=Arch.X86_64)
    assert spec.profile == name
    assert spec.description, f"profile {name} has no description"
    text = (Path(spec.origins["profile"])).read_text()
    assert text.lstrip().startswith("#"), f"profile {name} should explain itself in comments"


def test_default_profile_is_cpu_on_the_host_arch():
    spec = resolve()
    assert spec.profile == "cpu"
    assert spec.arch is Arch.host()
    assert not spec.cuda


def test_misspelled_key_names_file_line_and_nearest_key():
    with pytest.raises(ProfileError) as exc:
        resolve(str(FIXTURES / "typo.yaml"))
    msg = str(exc.value)
    assert "typo.yaml:3" in msg
    assert "'cuda_arch_lsit'" in msg
    assert "did you mean 'cuda_arch_list'" in msg


def test_unknown_key_in_set_is_suggested():
    with pytest.raises(ProfileError, match="did you mean 'python_version'"):
        resolve("cpu", ["pyhton_version=3.12"])


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("arch=sparc", "'sparc' is not allowed"),
        ("blas=openblass", "did you mean 'openblas'"),
        ("mpi=lam", "'lam' is not allowed"),
        ("max_jobs=0", "auto or a whole number"),
        ("max_jobs=many", "auto or a whole number"),
        ("mem_per_job_gb=-1", "number > 0"),
        ("python_version=three", "malformed"),
        ("switches.CMAKE_FOO=1", "not allowed"),
        ("distributed=gloo,tcp", "'tcp' is not allowed"),
        ("nccl=maybe", "'maybe' is not allowed"),
    ],
)
def test_bad_values_are_named(override, fragment):
    with pytest.raises(ProfileError, match=fragment) as exc:
        resolve("cpu", [override])
    assert str(exc.value).startswith("--set: key ")


def test_malformed_cuda_arch_is_rejected_with_the_profile_file(tmp_path):
    p = write(tmp_path, "bad.yaml", 'extends: cuda\ncuda_arch_list: ["8.0", "9.O"]\n')
    with pytest.raises(ProfileError) as exc:
        resolve(str(p))
    assert f"{p}:2" in str(exc.value)
    assert "'9.O' is not a CUDA architecture" in str(exc.value)


def test_unquoted_python_version_float_is_refused_with_a_hint(tmp_path):
    p = write(tmp_path, "f.yaml", "python_version: 3.10\n")
    with pytest.raises(ProfileError) as exc:
        resolve(str(p))
    assert "read as a number" in str(exc.value)
    assert "quote it" in exc.value.hint


def test_set_keeps_version_text_intact():
    assert resolve("cpu", [TEST_TORCH, "python_version=3.10"]).python_version == "3.10"


def test_invalid_yaml_names_the_line(tmp_path):
    p = write(tmp_path, "broken.yaml", "blas: openblas\nswitches: {USE_X: 1\n")
    with pytest.raises(ProfileError, match=r"broken.yaml:\d+: not valid YAML"):
        resolve(str(p))


def test_extends_merges_maps_and_child_wins(tmp_path):
    write(tmp_path, "parent.yaml", "blas: openblas\nswitches: {USE_A: '1', USE_B: '1'}\ncxxflags: [-O2]\n")
    child = write(tmp_path, "child.yaml", "extends: parent\nswitches: {USE_B: '0'}\ncxxflags: [-O3]\n")
    spec = resolve(str(child), ["switches.USE_C=1"])
    assert dict(spec.switches) == {"USE_A": "1", "USE_B": "0", "USE_C": "1"}
    assert spec.cxxflags == ("-O3",)  # lists are replaced, not appended
    assert spec.origins["cxxflags"].endswith("child.yaml:3")
    assert spec.origins["switches"] == "--set"


def test_extends_cycle_is_an_error(tmp_path):
    write(tmp_path, "a.yaml", "extends: b\n")
    write(tmp_path, "b.yaml", "extends: a\n")
    with pytest.raises(ProfileError, match="cycle"):
        resolve(str(tmp_path / "a.yaml"))


def test_unknown_profile_suggests_a_name():
    with pytest.raises(ProfileError, match="did you mean 'gh200'"):
        resolve("gh2000")


@pytest.mark.parametrize(
    ("profile", "overrides", "fragment"),
    [
        ("cpu", ["cuda_arch_list=9.0"], "cuda_version is empty"),
        ("cpu", [TEST_TORCH, "cuda_version=12.4"], "without cuda_arch_list"),
        ("cpu", ["distributed=gloo,nccl"], "nccl needs a CUDA build"),
        ("cpu", ["distributed=mpi"], "mpi is none"),
        ("cpu", ["mkl_threading=SEQ"], "only applies with blas: mkl"),
        ("archer2", ["arch=aarch64"], "MKL exists only for x86_64"),
        ("cpu", ["blas=nvpl", "arch=x86_64"], "NVPL exists only for aarch64"),
    ],
)
def test_contradictions_are_rejected(profile, overrides, fragment):
    with pytest.raises(ProfileError, match=fragment):
        resolve(profile, overrides, host=Arch.X86_64)


def test_spec_is_frozen_and_hash_is_stable_and_sensitive():
    a, b = resolve("gh200"), resolve("gh200")
    assert a.hash == b.hash and len(a.hash) == 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.blas = "mkl"  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.switches["USE_X"] = "1"  # type: ignore[index]
    assert resolve("gh200", ["switches.USE_MAGMA=1"]).hash != a.hash


def test_gh200_profile_facts():
    spec = resolve("gh200", [TEST_TORCH])
    assert spec.arch is Arch.AARCH64
    assert spec.cuda_arch_list == ("9.0",)
    assert spec.build_version == "2.6.0+gh200"
    assert spec.image_tag == "torchbuild/toolchain:gh200-2.6.0-aarch64"
    env = build_env(spec, cache_root="/cache", jobs=4)
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert env["CXXFLAGS"] == "-ffunction-sections -fdata-sections -flax-vector-conversions -Wno-nonnull"
    assert env["USE_PRIORITIZED_TEXT_FOR_LD"] == "1"
    assert env["USE_MAGMA"] == "0"
    assert "max-page-size=0x10000" in env["LDFLAGS"]


def test_shipped_site_profiles():
    archer2 = build_env(resolve("archer2"), cache_root="/c", jobs=1)
    assert (archer2["USE_CUDA"], archer2["BLAS"], archer2["MKL_THREADING"], archer2["USE_MPI"]) == (
        "0",
        "MKL",
        "SEQ",
        "1",
    )
    derecho = resolve("derecho")
    env = build_env(derecho, cache_root="/c", jobs=1)
    assert derecho.cuda_arch_list == ("8.0",)
    assert (env["USE_CUDA"], env["USE_MPI"], env["USE_SYSTEM_NCCL"]) == ("1", "1", "1")
    cuda = resolve("cuda")
    assert cuda.cuda_arch_list == ("8.0", "9.0") and cuda.arch is Arch.X86_64


def test_arch_option_overrides_profile_and_accepts_aliases():
    assert resolve("cpu", arch="arm64").arch is Arch.AARCH64
    assert resolve("cpu", arch="amd64").arch is Arch.X86_64
    with pytest.raises(ProfileError, match="unknown arch"):
        resolve("cpu", arch="riscv64")


def test_cache_dir_default_follows_xdg_cache_home(tmp_path, monkeypatch):
    """$XDG_CACHE_HOME/torchbuild where XDG_CACHE_HOME is set (a site that puts caches on scratch
    says so once for every tool); unset, or naming ~/.cache, the default stays the text
    defaults.yaml documents; a profile's or --set's cache_dir wins over both."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert resolve("cpu").cache_dir == "~/.cache/torchbuild"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    assert resolve("cpu").cache_dir == "~/.cache/torchbuild"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "scratch"))
    spec = resolve("cpu")
    assert spec.cache_dir == str(tmp_path / "scratch" / "torchbuild")
    assert spec.origins["cache_dir"] == "defaults.yaml"
    assert resolve("cpu", [f"cache_dir={tmp_path}/mine"]).cache_dir == f"{tmp_path}/mine"
