from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from torchbuild import __version__
from torchbuild.arch import Arch
from torchbuild.config import resolve
from torchbuild.engine import build_failure, certificate_failure, certificate_hint, host_ca_files, pull_failure
from torchbuild.errors import ImageBuildFailed, ProfileError
from torchbuild.image import (
    apt_packages,
    build_args,
    image_command,
    image_context,
    image_inputs,
    input_differences,
    inputs_hash,
    labels,
    make_context,
    manifest_commands,
    tree_digest,
    wanted_inputs,
    write_package_lists,
)


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
    assert args == {"BASE_IMAGE": "ubuntu:24.04", "PYTHON_VERSION": "3.13", "VENV_FLAGS": "--system-site-packages"}


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
    # no build arg carries a list for a shell to split, nor a quote for pip to choke on
    assert not any(c in v for v in build_args(spec).values() for c in "'\" <>")
    dockerfile = (tmp_path / "Dockerfile").read_text() if (tmp_path / "Dockerfile").exists() else ""
    assert "PYTHON_PACKAGES" not in dockerfile


def test_dockerfile_reads_the_lists_without_shell_splitting(tmp_path):
    image_context(resolve("cpu"), tmp_path)
    dockerfile = (tmp_path / "Dockerfile").read_text()
    assert "pip install -r /opt/torchbuild/inputs/requirements.txt" in dockerfile
    assert '"${apt_packages[@]}"' in dockerfile and '"${apt_options[@]}"' in dockerfile
    for arg in ("${PYTHON_PACKAGES}", "${APT_PACKAGES}", "${APT_OPTIONS}"):
        assert arg not in dockerfile


@pytest.mark.parametrize(
    "entry",
    ["--index-url=http://evil.example/simple", "-e .", "numpy; rm -rf /", "numpy\n--pre", "numpy $(reboot)", ""],
)
def test_python_package_that_is_not_a_requirement_is_refused(tmp_path, entry):
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
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    make_context(resolve("cpu", [f"ca_certificates={cert}"]), ctx)
    assert (ctx / "Dockerfile").read_text().startswith("#")
    assert (ctx / "certs" / "00-site.crt").read_text() == cert.read_text()
    assert (ctx / "torchbuild-src" / "pyproject.toml").is_file()
    assert (ctx / "torchbuild-src" / "configs" / "defaults.yaml").is_file()
    assert not list(ctx.rglob("__pycache__"))


def test_missing_ca_certificate_is_named(tmp_path):
    with pytest.raises(ImageBuildFailed, match=r"nope\.crt is not a file"):
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
    cert.write_text("-----BEGIN CERTIFICATE-----\nA\n")
    spec = resolve("cpu", [f"ca_certificates={cert}"])
    image = _inspect(spec)
    assert input_differences(image, wanted_inputs(spec, "sha256:base")) == []
    cert.write_text("-----BEGIN CERTIFICATE-----\nB\n")  # the site's CA was replaced
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
    assert diffs[0] == "base_image: not recorded in the image, profile ubuntu:24.04"
    assert len(diffs) == len(wanted_inputs(spec))


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
    specs = [resolve("gh200", ["image_name=registry.example.org/hpc/toolchain"], arch=a) for a in ("x86_64", "aarch64")]
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
