from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TEST_TORCH

from torchbuild import __version__
from torchbuild.core.arch import Arch
from torchbuild.core.errors import ImageBuildFailed, ProfileError
from torchbuild.image.host import (
    LockedBy,
    _lock_failure,
    apt_packages,
    build_args,
    default_lock_path,
    find_lock,
    image_command,
    image_context,
    image_inputs,
    input_differences,
    inputs_hash,
    labels,
    lock_differences,
    lock_inputs,
    make_context,
    manifest_commands,
    tree_digest,
    wanted_inputs,
    write_package_lists,
)
from torchbuild.image.lock import Lock, LockError, PipPin
from torchbuild.profile.config import resolve
from torchbuild.runtime.engine import build_failure, certificate_failure, certificate_hint, host_ca_files, pull_failure

CA_A, CA_B = (Path(__file__).parents[2] / "fixtures" / "ca" / f"site-{x}.crt" for x in "ab")


def test_apt_packages_follow_the_profile():
    assert apt_packages(resolve("cpu")) == ["gcc", "g++", "libopenblas-dev"]
    archer2 = apt_packages(resolve("archer2"))
    assert "libmkl-dev" in archer2 and "libmpich-dev" in archer2
    clang = apt_packages(resolve("cpu", ["compiler=clang", "compiler_version=18", "apt_packages=libnuma-dev,gcc"]))
    assert clang[:2] == ["clang-18", "libomp-18-dev"] and clang[-2:] == ["libnuma-dev", "gcc"]
    assert len(clang) == len(set(clang))
    debian_cuda = apt_packages(resolve("cuda", ["cuda_packages=nvidia-cuda-toolkit,libnccl-dev"]))
    assert debian_cuda[-2:] == ["nvidia-cuda-toolkit", "libnccl-dev"]


def test_build_args():
    args = build_args(resolve("cpu", ["python_version=3.13", "python_system_site_packages=true"]))
    assert args == {
        "BASE_IMAGE": "ubuntu:24.04",
        "PYTHON_VERSION": "3.13",
        "VENV_FLAGS": "--system-site-packages",
        "TORCHBUILD_CUDA_VERSION": "",  # a CPU build: cuda-check.sh checks nothing
        "TORCHBUILD_CUDA_HOME": "/usr/local/cuda",
    }


def _bash_reads(path) -> list[str]:
    """The words the Dockerfile's `mapfile -t` + quoted "${a[@]}" hand to apt or pip."""
    script = 'mapfile -t a < "$1"; printf "%s\\0" "${a[@]}"'
    out = subprocess.run(["bash", "-c", script, "bash", str(path)], capture_output=True, text=True, check=True).stdout
    return [w for w in out.split("\0") if w]


def test_specifiers_and_apt_options_reach_pip_and_apt_intact(tmp_path):
    spec = resolve("cpu", ['python_packages=["numpy<2", "setuptools>=70.1", "six; python_version<\'4\'"]'])
    write_package_lists(spec, tmp_path, ["-o Acquire::Check-Valid-Until=false", "-q"])
    inputs = tmp_path / "inputs"
    assert (inputs / "requirements.txt").read_text().splitlines() == [
        "numpy<2",
        "setuptools>=70.1",
        "six; python_version<'4'",
    ]
    assert _bash_reads(inputs / "apt-options.txt") == ["-o", "Acquire::Check-Valid-Until=false", "-q"]
    assert _bash_reads(inputs / "apt-packages.txt") == ["gcc", "g++", "libopenblas-dev"]
    assert _bash_reads(inputs / "pythons.txt") == ["3.12"]
    assert not (inputs / "lock").exists()
    # no build arg carries a list for a shell to split, nor a quote for pip to choke on
    assert not any(c in v for v in build_args(spec).values() for c in "'\" <>")
    dockerfile = (tmp_path / "Dockerfile").read_text() if (tmp_path / "Dockerfile").exists() else ""
    assert "PYTHON_PACKAGES" not in dockerfile


def test_dockerfile_reads_the_lists_without_shell_splitting(tmp_path):
    image_context(resolve("cpu"), tmp_path)
    dockerfile = (tmp_path / "Dockerfile").read_text()
    assert (
        '--report "/opt/torchbuild/record/pip-$v.json" \\\n               -r /opt/torchbuild/inputs/requirements.txt'
        in dockerfile
    )
    assert '"${apt_packages[@]}"' in dockerfile and '"${apt_options[@]}"' in dockerfile
    for arg in ("${PYTHON_PACKAGES}", "${APT_PACKAGES}", "${APT_OPTIONS}"):
        assert arg not in dockerfile


@pytest.mark.parametrize(
    "entry",
    ["--index-url=http://evil.example/simple", "-e .", "numpy; rm -rf /", "numpy\n--pre", "numpy $(reboot)", ""],
)
def test_python_package_that_is_not_a_requirement_is_refused(tmp_path, entry):
    if "\n" in entry:  # refused as the profile resolves; the image's own check stays for a spec made otherwise
        with pytest.raises(ProfileError, match="control character"):
            resolve("cpu", [f"python_packages={json.dumps([entry])}"])
        spec = dataclasses.replace(resolve("cpu"), python_packages=(entry,))
    else:
        spec = resolve("cpu", [f"python_packages={json.dumps([entry])}"])
    with pytest.raises(ProfileError, match=r"python_packages: .* is not a requirement"):
        write_package_lists(spec, tmp_path)
    assert not (tmp_path / "inputs" / "requirements.txt").exists()


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("apt_packages", "libfoo;reboot"),
        ("apt_packages", "$(reboot)"),
        ("apt_packages", "a b"),
        ("apt_packages", "-o"),
        ("apt_packages", "Libfoo"),
        ("apt_packages", "lib*"),
        ("cuda_packages", "nvidia-cuda-toolkit>x"),
    ],
)
def test_apt_name_that_debian_does_not_allow_is_refused(key, name):
    with pytest.raises(ProfileError, match=f"{key}: .* is not a Debian package name"):
        apt_packages(resolve("cpu", [f"{key}={json.dumps([name])}"]))


@pytest.mark.parametrize(
    "name",
    ["gcc-13", "libstdc++-13-dev", "python3.12-dev", "libfoo:arm64", "gcc=4:12.2.0-3", "cmake/bookworm-backports"],
)
def test_debian_package_names_are_accepted(name):
    assert apt_packages(resolve("cpu", [f"apt_packages={name}"]))[-1] == name


def test_context_holds_dockerfile_source_and_certs(tmp_path):
    cert = tmp_path / "site.crt"
    cert.write_bytes(CA_A.read_bytes())
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    make_context(resolve("cpu", [f"ca_certificates={cert}"]), ctx)
    assert (ctx / "Dockerfile").read_text().startswith("#")
    assert (ctx / "certs" / "00-site.crt").read_text() == cert.read_text()
    assert (ctx / "torchbuild-src" / "pyproject.toml").is_file()
    assert (ctx / "torchbuild-src" / "configs" / "defaults.yaml").is_file()
    assert not list(ctx.rglob("__pycache__"))


def test_missing_ca_certificate_is_named(tmp_path):
    with pytest.raises(ProfileError, match=r"nope\.crt is not a file"):
        make_context(resolve("cpu", [f"ca_certificates={tmp_path}/nope.crt"]), tmp_path)


def test_tree_digest_is_content_based(tmp_path):
    (tmp_path / "a").write_text("1")
    first = tree_digest(tmp_path)
    (tmp_path / "a").write_text("1")  # rewritten, same content: same digest
    assert tree_digest(tmp_path) == first
    (tmp_path / "a").write_text("2")
    assert tree_digest(tmp_path) != first


def test_inputs_hash_ignores_build_switches_but_not_image_inputs(tmp_path):
    def digest(spec, base_id="sha256:base"):
        ctx = tmp_path / f"ctx-{len(list(tmp_path.iterdir()))}"
        ctx.mkdir()
        image_context(spec, ctx)
        return inputs_hash(spec.arch, ctx, build_args(spec), base_id)

    base = resolve("cpu")
    h = digest(base)
    assert digest(resolve("cpu", ["switches.USE_MAGMA=0"])) == h
    assert digest(resolve("cpu", ["apt_packages=libnuma-dev"])) != h
    assert digest(resolve("cpu", ["python_packages=numpy<2"])) != h
    assert digest(base, "sha256:newbase") != h
    assert digest(resolve("cpu", arch="aarch64")) != h


def test_labels_record_profile_hash_and_versions():
    spec = resolve("cpu", arch="x86_64")
    lab = labels(spec, "abc", "sha256:base")
    assert lab["org.torchbuild.profile-hash"] == spec.hash
    assert lab["org.torchbuild.base-image"] == "ubuntu:24.04"
    assert lab["org.torchbuild.arch"] == Arch.X86_64.value


def _inspect(spec, base_id="sha256:base", **label_changes):
    """`docker image inspect` data of an image built for spec (plain data, as the engine gives it)."""
    lab = {**labels(spec, "abc", base_id), **label_changes}
    return {"Id": "sha256:image", "Architecture": "amd64", "Config": {"Labels": lab}}


def test_labels_record_every_image_input():
    cert_spec = resolve("cpu", ["python_packages=numpy<2,six", "apt_packages=libnuma-dev", "compiler_version=13"])
    recorded = image_inputs(_inspect(cert_spec))
    assert recorded == wanted_inputs(cert_spec, "sha256:base")
    assert recorded["python_version"] == "3.12" and recorded["base_image_id"] == "sha256:base"
    assert json.loads(recorded["python_packages"]) == ["numpy<2", "six"]
    assert json.loads(recorded["apt_packages"]) == ["gcc-13", "g++-13", "libopenblas-dev", "libnuma-dev"]
    assert recorded["compiler"] == "gcc-13"
    assert input_differences(_inspect(cert_spec), wanted_inputs(cert_spec, "sha256:base")) == []


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("python_version=3.13", "python_version: image 3.12, profile 3.13"),
        ("base_image=torchbuild/base:trixie-x86_64", "base_image: image ubuntu:24.04, profile torchbuild/base:trixie"),
        ("compiler_version=14", "compiler: image gcc, profile gcc-14"),
        ("apt_packages=libnuma-dev", "apt_packages: profile adds libnuma-dev"),
        ("python_packages=numpy<2", "python_packages: profile adds numpy<2; image has numpy, pyyaml"),
        ("python_system_site_packages=true", "python_system_site_packages: image false, profile true"),
        ("blas=mkl", "apt_packages: profile adds libmkl-dev; image has libopenblas-dev the profile does not"),
    ],
)
def test_an_image_built_from_other_inputs_names_each_difference(override, expected):
    image = _inspect(resolve("cpu"))
    diffs = input_differences(image, wanted_inputs(resolve("cpu", [override]), "sha256:base"))
    assert any(d.startswith(expected) for d in diffs), diffs


@pytest.mark.parametrize(
    "override", ["cxxflags=-O3", "switches.USE_MAGMA=0", "max_jobs=2", "env.FOO=1", "local_version=site", "mpi=system"]
)
def test_build_settings_do_not_make_the_image_out_of_date(override):
    image = _inspect(resolve("cpu"))
    assert input_differences(image, wanted_inputs(resolve("cpu", [override]), "sha256:base")) == []


def test_ca_certificates_compare_by_content(tmp_path):
    cert = tmp_path / "site.crt"
    cert.write_bytes(CA_A.read_bytes())
    spec = resolve("cpu", [f"ca_certificates={cert}"])
    image = _inspect(spec)
    assert input_differences(image, wanted_inputs(spec, "sha256:base")) == []
    cert.write_bytes(CA_B.read_bytes())  # the site's CA was replaced
    (diff,) = input_differences(image, wanted_inputs(spec, "sha256:base"))
    assert diff.startswith("ca_certificates: profile adds sha256:")
    (diff,) = input_differences(_inspect(resolve("cpu")), wanted_inputs(spec, "sha256:base"))
    assert diff.startswith("ca_certificates: profile adds sha256:")


def test_a_new_base_image_or_another_torchbuild_makes_it_out_of_date():
    spec = resolve("cpu")
    diffs = input_differences(_inspect(spec), wanted_inputs(spec, "sha256:newer"))
    assert diffs == ["base_image_id: image sha256:base, profile sha256:newer"]
    old = _inspect(spec, **{"org.torchbuild.version": "0.0.1"})
    assert input_differences(old, wanted_inputs(spec)) == [f"torchbuild: image 0.0.1, this is {__version__}"]


def test_an_image_without_input_labels_is_out_of_date():
    spec = resolve("cpu")
    bare = {"Id": "sha256:x", "Config": {"Labels": {"org.torchbuild.version": __version__}}}
    diffs = input_differences(bare, wanted_inputs(spec))
    assert diffs[0].startswith("torchbuild source: the image's was not recorded")
    assert diffs[1] == "base_image: not recorded in the image, profile ubuntu:24.04"
    assert len(diffs) == len(wanted_inputs(spec)) + 1


def test_an_image_of_another_torchbuild_checkout_is_out_of_date_and_names_it():
    """The real build's resumed run wrote a request with a key the image's older torchbuild did
    not know (`keys unknown`); the image's source digest now says so before the build starts."""
    from torchbuild.image.host import source_digest

    spec = resolve("cpu")
    here = _inspect(spec)
    assert here["Config"]["Labels"]["org.torchbuild.source"] == source_digest()
    assert input_differences(here, wanted_inputs(spec, "sha256:base")) == []
    other = _inspect(spec, **{"org.torchbuild.source": "0" * 64})
    (diff,) = input_differences(other, wanted_inputs(spec, "sha256:base"))
    assert diff == "torchbuild source: the image's was another checkout (its steps would run other code)"


@pytest.mark.parametrize("value", ["numpy", "{not json", '{"a": 1}', "[1, 2]"])
def test_a_list_label_written_by_something_else_is_a_difference_not_a_crash(value):
    spec = resolve("cpu")
    image = _inspect(spec, **{"org.torchbuild.python-packages": value})
    (diff,) = input_differences(image, wanted_inputs(spec, "sha256:base"))
    assert diff.startswith("python_packages: ")


def test_the_hint_is_the_exact_image_command():
    spec = resolve("cpu", ["python_version=3.13", "python_packages=numpy<2,six", "cxxflags=-O3"], arch="x86_64")
    cmd = image_command(spec)
    assert shlex.split(cmd) == [
        "invoke",
        "image",
        "--profile",
        "cpu",
        "--arch",
        "x86_64",
        "--set",
        "python_version=3.13",
        "--set",
        "python_packages=numpy<2,six",
    ]
    comma = resolve("cpu", ['python_packages=["numpy>=1,<2"]'], arch="x86_64")
    assert shlex.split(image_command(comma))[-1] == 'python_packages=["numpy>=1,<2"]'


@pytest.mark.parametrize(
    "line",
    [
        "WARNING: Retrying ... SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] ...'))",
        "Could not fetch URL https://pypi.org/simple/numpy/: ... [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify",
        "Err:1 https://deb.example.org trixie InRelease  Certificate verification failed: The certificate is NOT trusted.",
        "curl: (60) SSL certificate problem: unable to get local issuer certificate",
        "fatal: unable to access 'https://github.com/x/y/': SSL certificate problem: self-signed certificate in chain",
    ],
)
def test_certificate_failures_are_recognised(line):
    assert certificate_failure(line)


@pytest.mark.parametrize(
    "line",
    ["Step 5/12 : RUN apt-get update", "ERROR: No matching distribution found for numpy<0", "Get:1 ca-certificates"],
)
def test_other_failures_are_not_certificate_failures(line):
    assert not certificate_failure(line)


def test_a_certificate_failure_names_ca_certificates_and_the_host_cas(tmp_path):
    cas = tmp_path / "local"
    (cas / "sub").mkdir(parents=True)
    for name in ("proxy.crt", "sub/root.pem"):
        (cas / name).write_text("-----BEGIN CERTIFICATE-----\n")
    (cas / "README").write_text("not a CA")
    found = host_ca_files([cas, tmp_path / "absent"])
    assert found == [cas / "proxy.crt", cas / "sub" / "root.pem"]
    pip = "\x1b[91mWARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
    pip += "connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate"
    err = build_failure("t:1", "failed after 9 s: returned 1", tmp_path / "b.log", pip, [cas])
    assert "\x1b" not in err.message and "SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED]" in err.message
    assert f"--set ca_certificates={cas / 'proxy.crt'},{cas / 'sub' / 'root.pem'}" in err.hint
    assert "ca_certificates=/path/to/site-ca.crt" in certificate_hint([], [tmp_path / "absent"])
    plain = build_failure("t:1", "failed after 9 s: returned 1", tmp_path / "b.log", None, [cas])
    assert "ca_certificates" not in plain.hint


def test_push_publishes_a_manifest_list_over_both_arches():
    specs = [
        resolve("gh200", [TEST_TORCH, "image_name=registry.example.org/hpc/toolchain"], arch=a)
        for a in ("x86_64", "aarch64")
    ]
    cmds = manifest_commands(specs)
    target = "registry.example.org/hpc/toolchain:gh200-2.6.0"
    assert cmds[0] == [
        "docker",
        "manifest",
        "create",
        "--amend",
        target,
        "registry.example.org/hpc/toolchain:gh200-2.6.0-x86_64",
        "registry.example.org/hpc/toolchain:gh200-2.6.0-aarch64",
    ]
    assert cmds[2][5:7] == ["--arch", "arm64"] and cmds[-1] == ["docker", "manifest", "push", "--purge", target]


def test_a_pull_the_engine_cannot_verify_points_at_the_engine_trust_store():
    err = pull_failure(
        "ubuntu:24.04", "Get https://registry-1.docker.io/v2/: x509: certificate signed by unknown authority"
    )
    assert "/etc/docker/certs.d" in err.hint
    assert "invoke base-image" in pull_failure("ubuntu:24.04", "manifest unknown").hint


# --------------------------------------------------------------------------- several Pythons


def test_each_python_reaches_the_dockerfile_as_a_quoted_word(tmp_path):
    spec = resolve("cpu", ['python_versions=["3.13", "3.12", "3.14"]'])
    assert spec.pythons == ("3.12", "3.13", "3.14")
    image_context(spec, tmp_path)
    assert _bash_reads(tmp_path / "inputs" / "pythons.txt") == ["3.12", "3.13", "3.14"]
    assert build_args(spec)["PYTHON_VERSION"] == "3.12"  # /opt/venv
    dockerfile = (tmp_path / "Dockerfile").read_text()
    assert "mapfile -t pythons < /opt/torchbuild/inputs/pythons.txt" in dockerfile
    assert 'apt_packages+=("python$v" "python$v-dev" "python$v-venv")' in dockerfile
    assert 'venv="/opt/venv-$v"; if [ "$v" = "${PYTHON_VERSION}" ]; then venv=/opt/venv; fi' in dockerfile
    assert '"python$v" -m venv ${VENV_FLAGS} "$venv"' in dockerfile


def test_python_versions_are_an_image_input(tmp_path):
    def digest(spec):
        ctx = tmp_path / f"ctx-{len(list(tmp_path.iterdir()))}"
        ctx.mkdir()
        image_context(spec, ctx)
        return inputs_hash(spec.arch, ctx, build_args(spec), "sha256:base")

    one, two = resolve("cpu"), resolve("cpu", ["python_versions=3.12,3.13"])
    assert digest(resolve("cpu", ["python_versions=3.12"])) == digest(one)  # python_version is always there
    assert digest(two) != digest(one)
    assert json.loads(wanted_inputs(two)["python_versions"]) == ["3.13"]
    assert json.loads(image_inputs(_inspect(two))["python_versions"]) == ["3.13"]
    diffs = input_differences(_inspect(one), wanted_inputs(two, "sha256:base"))
    assert diffs == ["python_versions: profile adds 3.13"]
    assert input_differences(_inspect(two), wanted_inputs(one, "sha256:base")) == [
        "python_versions: image has 3.13 the profile does not"
    ]
    assert "--set python_versions=3.12,3.13" in image_command(two)


# --------------------------------------------------------------------------- locks

H = "f" * 64


def _lock_for(spec, **changes) -> Lock:
    fields = {
        "profile": spec.profile,
        "arch": spec.arch.value,
        "inputs": lock_inputs(spec),
        "apt": ("gcc=4:13.2.0-7ubuntu1", "libstdc++-13-dev=13.2.0-23ubuntu4"),
        "pip": {v: (PipPin("pip", "26.3", (H,)), PipPin("numpy", "2.1.0", (H,))) for v in spec.pythons},
        **changes,
    }
    return Lock(**fields)


def test_the_lock_lives_beside_the_profile_one_per_arch():
    spec = resolve("cpu", arch="aarch64")
    assert default_lock_path(spec) == Path(spec.origins["profile"]).with_name("cpu.aarch64.lock")


def test_a_locked_context_carries_the_pins_quoted_and_the_lock_sha256(tmp_path):
    spec = resolve("cpu", ["python_versions=3.12,3.13"], arch="x86_64")
    locked = LockedBy(tmp_path / "cpu.x86_64.lock", _lock_for(spec), "1" * 64)
    (tmp_path / "ctx").mkdir()
    image_context(spec, tmp_path / "ctx", locked=locked)
    lock_dir = tmp_path / "ctx" / "inputs" / "lock"
    assert _bash_reads(lock_dir / "apt.txt") == ["gcc=4:13.2.0-7ubuntu1", "libstdc++-13-dev=13.2.0-23ubuntu4"]
    assert (lock_dir / "pip-3.13.txt").read_text() == f"pip==26.3 --hash=sha256:{H}\nnumpy==2.1.0 --hash=sha256:{H}\n"
    assert (lock_dir / "lock.sha256").read_text() == f"{'1' * 64}  cpu.x86_64.lock\n"
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert (
        '"${apt_lock[@]}"' in dockerfile and "mapfile -t apt_lock < /opt/torchbuild/inputs/lock/apt.txt" in dockerfile
    )
    assert 'pip install --require-hashes --no-deps -r "$lock"' in dockerfile
    assert "python -m pip install --no-deps /opt/torchbuild-src" in dockerfile


def test_a_lock_changes_the_inputs_hash_and_the_labels(tmp_path):
    spec = resolve("cpu", arch="x86_64")

    def digest(locked):
        ctx = tmp_path / f"ctx-{len(list(tmp_path.iterdir()))}"
        ctx.mkdir()
        image_context(spec, ctx, locked=locked)
        return inputs_hash(spec.arch, ctx, build_args(spec), "sha256:base")

    lock = _lock_for(spec)
    unlocked = digest(None)
    first = digest(LockedBy(tmp_path / "a.lock", lock, "1" * 64))
    assert len({unlocked, first, digest(LockedBy(tmp_path / "a.lock", lock, "2" * 64))}) == 3
    assert labels(spec, "abc", "sha256:base")["org.torchbuild.locked"] == "false"
    assert "org.torchbuild.lock-sha256" not in labels(spec, "abc", "sha256:base")
    locked = labels(spec, "abc", "sha256:base", "1" * 64)
    assert locked["org.torchbuild.locked"] == "true" and locked["org.torchbuild.lock-sha256"] == "1" * 64
    # whether an image was locked is recorded, not compared: a locked image is current for its profile
    assert input_differences(_inspect(spec, **locked), wanted_inputs(spec, "sha256:base")) == []


def test_a_lock_source_tree_copy_leaves_lock_files_out(tmp_path, monkeypatch):
    from torchbuild.image import host as image_mod

    root = tmp_path / "root"
    (root / "configs" / "profiles").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "configs" / "profiles" / "cpu.yaml").write_text("{}\n")
    (root / "configs" / "profiles" / "cpu.x86_64.lock").write_text("lock_version: 1\n")
    image_mod._copy_tree(root, tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy" / "configs" / "profiles").iterdir()) == ["cpu.yaml"]


@pytest.mark.parametrize(
    ("changes", "sets", "expected"),
    [
        ({"arch": "aarch64"}, [], "arch: lock aarch64, profile x86_64"),
        ({"profile": "gh200"}, [], "profile: lock gh200, profile cpu"),
        ({}, ["apt_packages=libnuma-dev"], "apt_packages: profile adds libnuma-dev"),
        ({}, ["python_versions=3.12,3.13"], "python_versions: profile adds 3.13"),
        ({}, ["python_packages=numpy<2"], "python_packages: profile adds numpy<2; lock has numpy"),
        ({}, ["python_version=3.13"], "python_version: lock 3.12, profile 3.13"),
        ({}, ["python_system_site_packages=true"], "python_system_site_packages: lock false, profile true"),
    ],
)
def test_a_lock_made_for_other_inputs_is_refused_naming_them(tmp_path, changes, sets, expected):
    lock = _lock_for(resolve("cpu", arch="x86_64"), **changes)
    spec = resolve("cpu", sets, arch="x86_64")
    diffs = lock_differences(lock, spec)
    assert any(d.startswith(expected) for d in diffs), diffs
    path = tmp_path / "cpu.x86_64.lock"
    path.write_text(lock.dump())
    with pytest.raises(LockError) as err:
        find_lock(spec, path)
    assert err.value.exit_code == 28 and expected in err.value.message
    assert err.value.hint.startswith("refresh it with `invoke image --profile cpu --arch x86_64")
    assert f"--lock --lock-file {path}" in err.value.hint


def test_build_settings_do_not_invalidate_a_lock(tmp_path):
    spec = resolve("cpu", arch="x86_64")
    path = tmp_path / "x.lock"
    path.write_text(_lock_for(spec).dump())
    for sets in (["cxxflags=-O3"], ["switches.USE_MAGMA=0"], ["max_jobs=2"]):
        found = find_lock(resolve("cpu", sets, arch="x86_64"), path)
        assert found is not None and found.lock.apt == _lock_for(spec).apt
        assert found.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_no_lock_beside_the_profile_means_unlocked_and_a_named_missing_one_is_an_error(tmp_path):
    spec = resolve("cpu", arch="x86_64")
    assert not default_lock_path(spec).exists()
    assert find_lock(spec) is None
    with pytest.raises(LockError, match=f"no lock at {tmp_path}/nope.lock"):
        find_lock(spec, tmp_path / "nope.lock")


def test_a_failed_locked_install_is_a_lock_error_with_the_refresh_command(tmp_path):
    spec = resolve("cpu", arch="x86_64")
    locked = LockedBy(tmp_path / "cpu.x86_64.lock", _lock_for(spec), "1" * 64)
    log = tmp_path / "image.log"
    log.write_text(
        "Step 9/36 : RUN ... printf 'torchbuild-lock: the locked %s packages did not install\\n' apt\n"
        "\x1b[91mE: Version '9.9.9-1' for 'cmake' was not found\n\x1b[0m"
        "torchbuild-lock: the locked apt packages did not install\n"
    )
    plain = ImageBuildFailed("building t failed")
    err = _lock_failure(spec, locked, log, plain)
    assert isinstance(err, LockError) and err.exit_code == 28
    assert "no longer installs: the locked apt packages did not install" in err.message
    assert "E: Version '9.9.9-1' for 'cmake' was not found" in err.message
    assert "--lock --rebuild --lock-file" in err.hint
    log.write_text("E: Unable to locate package gcc-99\n")  # not a locked step: the build's own error
    assert _lock_failure(spec, locked, log, plain) is plain


def test_lock_file_with_both_arches_is_refused_before_the_engine(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "invoke", "image", "--arch", "all", "--lock-file", str(tmp_path / "x.lock")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert res.returncode == 2 and "UsageError" in res.stderr and "--lock-file names one lock" in res.stderr


# -------------------------------------------------------------------- cuda_version (issue 41 item 27)

CHECK = Path(__file__).resolve().parents[3] / "containers" / "cuda-check.sh"
NVCC_12_4 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2024 NVIDIA Corporation
Built on Thu_Mar_28_02:18:24_PDT_2024
Cuda compilation tools, release 12.4, V12.4.131
Build cuda_12.4.r12.4/compiler.34097967_0
"""


def _cuda_home(tmp_path: Path, said: str, code: int = 0) -> Path:
    (tmp_path / "bin").mkdir(parents=True, exist_ok=True)
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\ncat <<'END'\n{said}END\nexit {code}\n")
    nvcc.chmod(0o755)
    return tmp_path


@pytest.mark.parametrize(
    ("want", "said", "code", "rc", "line"),
    [
        ("12.4", NVCC_12_4, 0, 0, "bin/nvcc is CUDA 12.4, as cuda_version says"),
        ("12.6", NVCC_12_4, 0, 1, "cuda_version is 12.6, and the image's nvcc ("),
        ("12.4", "nvcc: something else\n", 0, 1, "is CUDA of no release it names"),
        ("12.4", "libcudart.so.12: cannot open shared object file\n", 127, 1, "does not run (libcudart.so.12"),
        ("", "", 1, 0, ""),  # a CPU build: nothing checked
    ],
)
def test_cuda_check_compares_cuda_version_with_the_images_nvcc(tmp_path, want, said, code, rc, line):
    home = _cuda_home(tmp_path, said, code)
    done = subprocess.run(["bash", str(CHECK), want, str(home)], capture_output=True, text=True, check=False)
    assert done.returncode == rc and line in done.stdout, done.stdout + done.stderr
    if rc:
        assert done.stdout.startswith("torchbuild-cuda: cuda_version is ")


def test_the_image_runs_the_cuda_check_with_the_profiles_cuda_before_the_venvs(tmp_path):
    spec = resolve("cuda-offline")
    args = build_args(spec)
    assert (args["TORCHBUILD_CUDA_VERSION"], args["TORCHBUILD_CUDA_HOME"]) == ("12.4", "/usr")
    assert build_args(resolve("cpu", arch="x86_64"))["TORCHBUILD_CUDA_VERSION"] == ""
    image_context(spec, tmp_path)
    assert (tmp_path / "cuda-check.sh").read_bytes() == CHECK.read_bytes()
    recipe = (tmp_path / "Dockerfile").read_text()
    run = 'RUN bash /opt/torchbuild/cuda-check.sh "${TORCHBUILD_CUDA_VERSION}" "${TORCHBUILD_CUDA_HOME}"'
    assert run in recipe and recipe.index(run) < recipe.index("-m venv")


def test_a_failed_cuda_check_is_a_profile_error_naming_both_versions(tmp_path):
    from torchbuild.image.host import _profile_stop

    log = tmp_path / "image.log"
    log.write_text("Step 9/20 : RUN bash /opt/torchbuild/cuda-check.sh ...\n"
                   "torchbuild-cuda: cuda_version is 12.6, and the image's nvcc (/usr/bin/nvcc) is CUDA 12.4\n")  # fmt: skip
    err = ImageBuildFailed("building x failed")
    named = _profile_stop(resolve("cuda-offline", ["cuda_version=12.6"]), log, err)
    assert isinstance(named, ProfileError)
    assert "cuda_version is 12.6, and the image's nvcc (/usr/bin/nvcc) is CUDA 12.4" in named.message
    assert str(log) in named.message and "base image" in (named.hint or "")
    log.write_text("E: Unable to locate package x\n")
    assert _profile_stop(resolve("cuda-offline"), log, err) is err


def test_a_python_the_base_lacks_is_a_profile_error_naming_python_sources(tmp_path):
    from torchbuild.image.host import _profile_stop

    log = tmp_path / "image.log"
    log.write_text(
        "torchbuild-python: python3.12 is not in the base image's apt archive and python_sources names no source for it\n"
    )
    named = _profile_stop(resolve("cpu"), log, ImageBuildFailed("building x failed"))
    assert isinstance(named, ProfileError) and "python3.12 is not in the base image's apt archive" in named.message
    assert "cpu.yaml" in named.message and "python_sources" in (named.hint or "")


@pytest.mark.parametrize(
    ("sets", "problem"),
    [
        ([TEST_TORCH, "cuda_version=12.4"], "12.4, but base_image nvidia/cuda:12.6.3-cudnn-devel-ubuntu24.04 (/"),
        (["base_image=nvcr.io/nvidia/cuda:12.8.1-devel-ubuntu24.04"], "12.6, but base_image nvcr.io/nvidia/cuda:12.8"),
    ],
)
def test_cuda_version_must_be_the_cuda_of_an_nvidia_cuda_base_at_config(sets, problem):
    with pytest.raises(ProfileError, match="key 'cuda_version'") as err:
        resolve("cuda", sets)
    assert problem in err.value.message and "set cuda_version" in (err.value.hint or "")
    spec = resolve("cuda", [TEST_TORCH, "cuda_version=12.4", "base_image=nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04"])
    assert spec.cuda_version == "12.4"
    assert resolve("cuda", ["cuda_version=", "cuda_arch_list=[]", "distributed=[gloo]", "nccl=bundled"]).cuda is False


PY312 = "https://www.python.org/ftp/python/3.12.12/Python-3.12.12.tar.xz"
PY312_SHA = "fb85a13414b028c49ba18bbd523c2d055a30b56b18b92ce454ea2c51edc656c4"


def test_python_sources_reach_the_image_for_its_own_pythons_only(tmp_path):
    sources = json.dumps(
        {"3.12": f"{PY312}#sha256={PY312_SHA}", "3.9": f"https://mirror.example/py39.tgz#sha256={'a' * 64}"}
    )
    spec = resolve("cpu", [f"python_sources={sources}", 'python_versions=["3.13"]'])
    write_package_lists(spec, tmp_path)
    lines = (tmp_path / "inputs" / "python-sources.txt").read_text().splitlines()
    assert lines == [f"3.12 {PY312} {PY312_SHA}"]  # 3.9 is not one of the image's Pythons
    assert (tmp_path / "inputs" / "pythons.txt").read_text().split() == ["3.12", "3.13"]


@pytest.mark.parametrize(
    "value",
    [
        f"{PY312}",  # no sha256
        f"{PY312}#sha256={PY312_SHA[:-1]}",  # 63 digits
        f"{PY312}#sha256={PY312_SHA.upper()}",
        f"ftp://www.python.org/Python-3.12.12.tar.xz#sha256={PY312_SHA}",
        f"https://user:secret@mirror.example/Python-3.12.12.tar.xz#sha256={PY312_SHA}",  # a password
        f"https://mirror.example/a b.tar.xz#sha256={PY312_SHA}",  # a space would split the Dockerfile's line
    ],
)
def test_a_python_source_without_a_checkable_sha256_or_with_a_password_is_refused(value):
    with pytest.raises(ProfileError, match=r"python_sources.*entry '3\.12'") as err:
        resolve("cpu", [f"python_sources={json.dumps({'3.12': value})}"])
    assert "secret" not in err.value.message and "secret" not in (err.value.hint or "")


def test_python_sources_names_a_python_version_not_anything_else():
    with pytest.raises(ProfileError, match="python_sources"):
        resolve("cpu", [f"python_sources={json.dumps({'latest': f'{PY312}#sha256={PY312_SHA}'})}"])


def test_an_image_built_with_a_python_source_records_it_and_is_current():
    """The slow bullseye test's build met `python_sources: not recorded in the image` right after
    `invoke image` had built it: the input was wanted but not among the recorded ones."""
    sources = json.dumps({"3.12": f"{PY312}#sha256={PY312_SHA}"})
    spec = resolve("cpu", [f"python_sources={sources}"])
    image = _inspect(spec)
    assert json.loads(image_inputs(image)["python_sources"]) == [f"3.12 {PY312} {PY312_SHA}"]
    assert input_differences(image, wanted_inputs(spec, "sha256:base")) == []


def test_the_source_digest_covers_exactly_the_files_the_image_installs(tmp_path):
    from torchbuild.image.host import _copy_tree, source_files
    from torchbuild.profile.config import data_dir

    _copy_tree(data_dir(), tmp_path / "copy")
    copied = {p.relative_to(tmp_path / "copy").as_posix() for p in (tmp_path / "copy").rglob("*") if p.is_file()}
    listed = {rel for rel, _ in source_files(data_dir())}
    assert listed == copied and "src/torchbuild/image/host.py" in listed
    assert not any("__pycache__" in rel or rel.endswith(".pyc") for rel in listed)
