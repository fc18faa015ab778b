"""ca_certificates takes PEM certificates only (issue 27 item 7): /etc/passwd, a private key, a
DER file or a truncated certificate is a ProfileError naming the file (and the line), before
anything is pulled or built, and nothing of it reaches the image's build context."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchbuild.core.errors import ProfileError
from torchbuild.image.host import CA_LIMIT, make_context
from torchbuild.profile.config import resolve

CA = Path(__file__).parents[2] / "fixtures" / "ca"
A, B = ((CA / f"site-{x}.crt").read_text() for x in "ab")
KEY = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n"
BODY = A.splitlines()[1:-1]

# (what the file is, its bytes, the words the message must hold)
NOT_CERTIFICATES = [
    ("a passwd file", b"root:x:0:0:root:/root:/bin/bash\n", ["line 1 is not part of"]),
    ("a private key", KEY.encode(), ["line 1 begins a PRIVATE KEY block"]),
    ("a certificate and its key", (A + KEY).encode(), ["line 12 begins a PRIVATE KEY block"]),
    ("an empty file", b"", ["holds no -----BEGIN CERTIFICATE-----"]),
    ("only comments", b"# site CA goes here\n\n", ["holds no -----BEGIN CERTIFICATE-----"]),
    ("a DER certificate", b"\x30\x82\x01\x91\x30\x82\x01\x37", ["binary"]),
    ("a NUL byte", A.encode() + b"\0", ["binary"]),
    ("latin-1 text", "# caf\xe9\n".encode("latin-1") + A.encode(), ["not ASCII"]),
    ("no END line", "\n".join(A.splitlines()[:-1]).encode(), ["block at line 1", "no -----END CERTIFICATE-----"]),
    ("a truncated body", "\n".join([A.splitlines()[0], *BODY[:-2], A.splitlines()[-1]]).encode(), ["truncated"]),
    ("not base64", b"-----BEGIN CERTIFICATE-----\n!!notbase64!!\n-----END CERTIFICATE-----\n", ["not base64"]),
    ("base64 of text", b"-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n", ["no ASN.1"]),
    ("text after the block", (A + "trailing words\n").encode(), ["line 12 is not part of"]),
    ("an oversized file", b"#" * (CA_LIMIT + 1), ["more than the 1 MiB"]),
]


@pytest.mark.parametrize(("what", "data", "words"), NOT_CERTIFICATES, ids=[c[0] for c in NOT_CERTIFICATES])
def test_a_ca_file_that_is_not_a_pem_certificate_is_refused(tmp_path, what, data, words):
    bad = tmp_path / "site.crt"
    bad.write_bytes(data)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    with pytest.raises(ProfileError) as exc:
        make_context(resolve("cpu", [f"ca_certificates={bad}"]), ctx)
    assert str(bad) in exc.value.message
    for word in words:
        assert word in exc.value.message, (word, exc.value.message)
    assert "BEGIN CERTIFICATE" in exc.value.hint
    assert not list((ctx / "certs").glob("*.crt")), "nothing of a refused file reaches the context"


def test_etc_passwd_never_reaches_the_trust_store(tmp_path):
    with pytest.raises(ProfileError, match="/etc/passwd is not a PEM certificate"):
        make_context(resolve("cpu", ["ca_certificates=/etc/passwd"]), tmp_path)
    assert not list((tmp_path / "certs").glob("*.crt"))


def test_a_directory_or_device_as_ca_file_is_refused(tmp_path):
    for i, path in enumerate((tmp_path, Path("/dev/zero"))):
        ctx = tmp_path / f"ctx{i}"
        ctx.mkdir()
        with pytest.raises(ProfileError, match="not a file"):
            make_context(resolve("cpu", [f"ca_certificates={path}"]), ctx)


# (what the file is, its text): PEM certificate files as sites and distributions write them
CERTIFICATES = [
    ("one certificate", A),
    ("a bundle of two", A + B),
    ("a bundle with comments and blank lines", f"# Issuer: torchbuild test CA\n\n{A}\n# second\n{B}\n"),
    ("CRLF line ends", A.replace("\n", "\r\n")),
    ("no final newline", A.rstrip("\n")),
]


@pytest.mark.parametrize(("what", "text"), CERTIFICATES, ids=[c[0] for c in CERTIFICATES])
def test_pem_certificate_files_are_copied_as_they_are(tmp_path, what, text):
    cert = tmp_path / "site.pem"
    cert.write_bytes(text.encode())
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    make_context(resolve("cpu", [f"ca_certificates={cert}"]), ctx)
    assert (ctx / "certs" / "00-site.crt").read_bytes() == text.encode()


def test_the_hosts_own_ca_bundle_is_accepted(tmp_path):
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.is_file():
        pytest.skip("this host has no Debian CA bundle")
    make_context(resolve("cpu", [f"ca_certificates={bundle}"]), tmp_path)
    assert (tmp_path / "certs" / "00-ca-certificates.crt").read_bytes() == bundle.read_bytes()


def test_a_bad_ca_file_is_refused_before_the_engine_is_used(tmp_path):
    from torchbuild.image.host import build_image

    class NoEngine:
        def __getattr__(self, name):
            raise AssertionError(f"the engine was used ({name}) before the CA file was checked")

    with pytest.raises(ProfileError, match="not a PEM certificate"):
        build_image(resolve("cpu", ["ca_certificates=/etc/passwd"]), NoEngine(), logs_dir=tmp_path / "logs")  # type: ignore[arg-type]
    assert not (tmp_path / "logs").exists()
