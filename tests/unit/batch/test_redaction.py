"""Secrets stay secret (issue 41 item 5): the credentials of a URL are redacted wherever
torchbuild prints or writes one (errors, `invoke config`, the git lines of a log, manifests and
reports), the profile beside a batch script is its owner's alone, and a file that is not a
profile (`--profile /etc/shadow`) is named, never quoted."""

from __future__ import annotations

import io
import json
import stat

import pytest
from helpers import run_invoke

from torchbuild.core.console import redact
from torchbuild.core.errors import ProfileError, SourceError
from torchbuild.profile.config import resolve
from torchbuild.runtime.manifest import write_json
from torchbuild.source.fetch import fetch_git

SECRET = "hunter2"

# (a URL as given, as shown)
URLS = [
    ("https://u:hunter2@example.com/pytorch.git", "https://u:***@example.com/pytorch.git"),
    ("https://hunter2@github.com/o/r.git", "https://***@github.com/o/r.git"),  # a token as the user
    ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
    ("redis://h:6379/0?password=hunter2", "redis://h:6379/0?password=***"),
    ("https://h/x?a=1&access_token=hunter2&b=2", "https://h/x?a=1&access_token=***&b=2"),
    ("https://h/blob?sv=1&sig=hunter2", "https://h/blob?sv=1&sig=***"),
    ("http://user:hunter2@mirror/debian", "http://user:***@mirror/debian"),
    ("ssh://git@github.com/o/r.git", "ssh://git@github.com/o/r.git"),  # a user name, no secret
    ("git@github.com:o/r.git", "git@github.com:o/r.git"),
    ("https://example.com/pytorch.git", "https://example.com/pytorch.git"),
]


@pytest.mark.parametrize(("url", "shown"), URLS, ids=[u for u, _ in URLS])
def test_redact_hides_the_credentials_of_a_url_and_keeps_the_rest(url, shown):
    assert redact(url) == shown
    assert redact(f"clone of '{url}' failed") == f"clone of '{shown}' failed"


def test_a_refused_ccache_remote_is_not_repeated_with_its_password():
    res = run_invoke("config", "--set", f"ccache_remote=redis://h:6379/0?password={SECRET}")
    assert res.returncode == 2 and "error: ProfileError:" in res.stderr, res.stderr
    assert SECRET not in res.stdout + res.stderr and "password=***" in res.stderr


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_config_shows_urls_without_their_credentials(fmt):
    res = run_invoke(
        "config", "--format", fmt, "--set", f"torch_repo=https://u:{SECRET}@example.com/pytorch.git",
        "--set", f"sif_mirror=http://{SECRET}@mirror.example/debian",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert SECRET not in res.stdout and "https://u:***@example.com/pytorch.git" in res.stdout


def test_the_git_lines_of_a_log_and_the_error_carry_no_token(tmp_path):
    out = io.StringIO()
    with pytest.raises(SourceError) as exc:  # nothing listens on port 1: git fails at once
        fetch_git(f"https://u:{SECRET}@127.0.0.1:1/pytorch.git", "main", tmp_path / "t", None, out)
    assert "$ git clone" in out.getvalue() and SECRET not in out.getvalue(), out.getvalue()
    assert SECRET not in redact(exc.value.message)


def test_a_manifest_or_report_is_written_without_credentials(tmp_path):
    path = write_json(tmp_path / "m.json", {"source": {"url": f"https://u:{SECRET}@example.com/p.git"}}, "test")
    assert SECRET not in path.read_text()
    assert json.loads(path.read_text())["source"]["url"] == "https://u:***@example.com/p.git"


def test_the_profile_beside_a_batch_script_is_readable_by_its_owner_alone(tmp_path):
    from test_scheduler import _job

    from torchbuild.runtime.scheduler import scheduler_for, write_job

    spec = resolve("cpu", [f"torch_repo=https://u:{SECRET}@example.com/pytorch.git"], arch="x86_64")
    profile = tmp_path / "jobs" / "cpu.yaml"
    script = write_job(scheduler_for("slurm"), _job(tmp_path, spec), profile)
    assert stat.S_IMODE(profile.stat().st_mode) == 0o600
    assert SECRET not in script.read_text()


SHADOW = "root:$y$j9T$abcdefgh$hunter2hunter2hunter2:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"


@pytest.mark.parametrize("text", [SHADOW, "root: x\nbin: y\n", "hunter2: [a, b]\n"], ids=["shadow", "map", "list"])
def test_a_file_that_is_not_a_profile_is_named_and_never_quoted(tmp_path, text):
    path = tmp_path / "shadow"
    path.write_text(text)
    for route in ([str(path)], None):
        with pytest.raises(ProfileError) as exc:
            if route:
                resolve(route[0])
            else:  # the same file named by extends:
                (tmp_path / "p.yaml").write_text(f"extends: {path}\n")
                resolve(str(tmp_path / "p.yaml"))
        message = exc.value.message
        assert "is not a profile" in message or "a profile must be a mapping" in message, message
        for word in ("root", SECRET, "daemon", "bin"):
            assert word not in message.replace(str(tmp_path), ""), message


def test_a_profile_with_a_typo_still_names_the_unknown_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("description: x\npython_verison: '3.12'\n")
    with pytest.raises(ProfileError, match="unknown key 'python_verison'; did you mean 'python_version'"):
        resolve(str(path))


def test_image_labels_and_the_profile_baked_into_a_sif_carry_no_credentials():
    """Item 5: a requirement's URL token and a git URL's password reached the image's labels
    (`docker image inspect`, anyone with the engine) and the profile inside the SIF (a file
    people copy); the profile beside a batch job keeps them (it runs the build, 0600)."""
    from torchbuild.image.host import labels
    from torchbuild.profile.config import profile_text, shareable_profile_text

    token = "ghp_" + "s3cr3t" * 4
    spec = resolve(
        "cpu",
        [
            f"python_packages=[numpy, 'mypkg @ https://bot:{token}@git.example.org/mypkg.tar.gz']",
            "torch_repo=https://oauth2:hunter2pass@gitlab.site.example/ml/pytorch.git",
        ],
    )
    lab = labels(spec, "abc", "sha256:base")
    assert "mypkg @ https://bot:***@git.example.org/mypkg.tar.gz" in lab["org.torchbuild.python-packages"]
    assert not any(token in v for v in lab.values())
    baked = shareable_profile_text(spec)
    assert (
        token not in baked
        and "hunter2pass" not in baked
        and "https://oauth2:***@gitlab.site.example/ml/pytorch.git" in baked
    )
    assert baked.startswith("# credentials in URLs removed")
    assert "hunter2pass" in profile_text(spec)  # the batch job's own copy still works
