"""Clone logic against local git repositories with submodules over file:// (no GitHub here)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from torchbuild.core.errors import ProfileError, SourceError, UsageError
from torchbuild.profile.config import resolve
from torchbuild.source.fetch import (
    _clone,
    describe_dir,
    fetch_git,
    get_source,
    mirror_path,
    unpack_archive,
    update_tree,
)

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def git(*args: str, cwd: Path) -> str:
    import os

    out = subprocess.run(
        ["git", "-c", "protocol.file.allow=always", *args],
        cwd=cwd,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def commit_file(repo: Path, name: str, text: str, msg: str) -> str:
    (repo / name).write_text(text)
    git("add", name, cwd=repo)
    git("commit", "-q", "-m", msg, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    """A 'pytorch' repo with a nested submodule chain (third_party/lib -> inner), two tags, a branch.
    Its submodules are local repositories over file://, which git (and torchbuild) check out
    only where the user's git configuration allows it: this user does, for these tests."""
    for key, value in {"COUNT": "1", "KEY_0": "protocol.file.allow", "VALUE_0": "always"}.items():
        monkeypatch.setenv(f"GIT_CONFIG_{key}", value)
    inner = tmp_path / "inner"
    inner.mkdir()
    git("init", "-q", "-b", "main", cwd=inner)
    commit_file(inner, "inner.txt", "inner v1\n", "inner")
    lib = tmp_path / "lib"
    lib.mkdir()
    git("init", "-q", "-b", "main", cwd=lib)
    commit_file(lib, "lib.txt", "lib v1\n", "lib")
    git("submodule", "add", "-q", inner.as_uri(), "inner", cwd=lib)
    git("commit", "-q", "-m", "add inner", cwd=lib)
    top = tmp_path / "pytorch"
    top.mkdir()
    git("init", "-q", "-b", "main", cwd=top)
    commit_file(top, "setup.py", "# v1\n", "v1")
    git("submodule", "add", "-q", lib.as_uri(), "third_party/lib", cwd=top)
    git("commit", "-q", "-m", "add lib", cwd=top)
    git("tag", "v1.0.0", cwd=top)
    commit_file(top, "setup.py", "# v2\n", "v2")
    git("tag", "v2.0.0", cwd=top)
    return top


def test_clone_tag_with_nested_submodules_through_a_mirror(upstream, tmp_path):
    cache = tmp_path / "cache"
    info = fetch_git(upstream.as_uri(), "v1.0.0", tmp_path / "src1", cache)
    assert (info.path / "setup.py").read_text() == "# v1\n"
    assert (info.path / "third_party/lib/lib.txt").read_text() == "lib v1\n"
    assert (info.path / "third_party/lib/inner/inner.txt").read_text() == "inner v1\n"
    assert info.commit == git("rev-parse", "v1.0.0", cwd=upstream)
    assert {p for p, _ in info.submodules} == {"third_party/lib", "third_party/lib/inner"}
    assert (mirror_path(cache, upstream.as_uri()) / "HEAD").is_file()
    # origin points at the real upstream, not at the cache
    assert git("config", "--get", "remote.origin.url", cwd=info.path) == upstream.as_uri()


def test_second_clone_at_another_tag_reuses_the_mirror(upstream, tmp_path):
    cache = tmp_path / "cache"
    fetch_git(upstream.as_uri(), "v1.0.0", tmp_path / "a", cache)
    mirror = mirror_path(cache, upstream.as_uri())
    inode_before = (mirror / "objects").stat().st_ino
    info = fetch_git(upstream.as_uri(), "v2.0.0", tmp_path / "b", cache)
    assert (info.path / "setup.py").read_text() == "# v2\n"
    assert (mirror / "objects").stat().st_ino == inode_before  # updated in place, not cloned again
    alternates = (info.path / ".git/objects/info/alternates").read_text()
    assert str(mirror) in alternates  # objects borrowed, not copied


def test_clone_by_commit_and_branch(upstream, tmp_path):
    sha = git("rev-parse", "v1.0.0", cwd=upstream)
    assert fetch_git(upstream.as_uri(), sha, tmp_path / "c", tmp_path / "cache").commit == sha
    br = fetch_git(upstream.as_uri(), "main", tmp_path / "d", tmp_path / "cache")
    assert br.commit == git("rev-parse", "main", cwd=upstream)


def test_shallow_clone_without_cache(upstream, tmp_path):
    info = fetch_git(upstream.as_uri(), "v2.0.0", tmp_path / "s", None)
    assert git("rev-parse", "--is-shallow-repository", cwd=info.path) == "true"
    assert (info.path / "third_party/lib/inner/inner.txt").is_file()


def test_bad_ref_leaves_nothing_behind(upstream, tmp_path):
    dest = tmp_path / "bad"
    with pytest.raises(SourceError, match=r"cannot check out v9\.9\.9"):
        fetch_git(upstream.as_uri(), "v9.9.9", dest, tmp_path / "cache")
    assert not dest.exists()
    assert not list(tmp_path.glob(".bad.partial*"))


def test_existing_destination_is_refused(upstream, tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(SourceError, match="already exists"):
        fetch_git(upstream.as_uri(), "v1.0.0", tmp_path / "x", None)


def test_update_brings_branch_and_submodules_to_head(upstream, tmp_path):
    info = fetch_git(upstream.as_uri(), "main", tmp_path / "u", tmp_path / "cache")
    lib = Path(upstream.parent / "lib")
    commit_file(lib, "lib.txt", "lib v2\n", "lib v2")
    git("-C", "third_party/lib", "fetch", "-q", cwd=upstream)
    git("-C", "third_party/lib", "checkout", "-q", "origin/main", cwd=upstream)
    git("add", "third_party/lib", cwd=upstream)
    git("commit", "-q", "-m", "bump lib", cwd=upstream)
    new = update_tree(info.path)
    assert new.commit == git("rev-parse", "main", cwd=upstream)
    assert (info.path / "third_party/lib/lib.txt").read_text() == "lib v2\n"


def test_update_refuses_a_detached_tag(upstream, tmp_path):
    info = fetch_git(upstream.as_uri(), "v1.0.0", tmp_path / "t", None)
    with pytest.raises(SourceError, match="detached"):
        update_tree(info.path)


def _release_tarball(tmp_path: Path, name: str, file: str, text: str) -> tuple[Path, Path]:
    """tmp_path/NAME/FILE holding text, packed as tmp_path/NAME.tar.gz: (the tree, the tarball)."""
    tree = tmp_path / name
    tree.mkdir()
    (tree / file).write_text(text)
    tarball = tmp_path / f"{name}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(tree, arcname=name)
    return tree, tarball


def test_tarball_is_unpacked_once_with_its_sha256(tmp_path):
    _, tarball = _release_tarball(tmp_path, "pytorch-v2.6.0", "setup.py", "# x\n")
    info = unpack_archive(tarball, tmp_path / "srcs")
    assert (info.path / "setup.py").read_text() == "# x\n"
    assert info.kind == "tarball" and len(info.sha256) == 64
    assert unpack_archive(tarball, tmp_path / "srcs").path == info.path


def test_torch_sha256_pins_the_archive_and_refuses_another_before_unpacking(tmp_path):
    """torch_sha256 (a key declared once, in profile/keys.py): the archive it names is unpacked;
    another is a SourceError naming both digests, and nothing is unpacked or created; a git or
    directory source with it set is refused by name (the digest would never be checked)."""
    tree, tarball = _release_tarball(tmp_path, "pytorch-v2.15.0", "pyproject.toml", "[build-system]\n")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    wrong = "0" * 64
    srcs = tmp_path / "srcs"
    spec = resolve("cpu", [f"torch_sha256={wrong}", f"cache_dir={tmp_path / 'cache'}"], arch="x86_64")
    with pytest.raises(SourceError, match=f"has sha256 {digest}, not the profile's torch_sha256 {wrong}"):
        get_source(spec, str(tarball), dest=str(srcs), out=io.StringIO())
    assert not srcs.exists()
    good = dataclasses.replace(spec, torch_sha256=digest)
    info = get_source(good, str(tarball), dest=str(srcs), out=io.StringIO())
    assert info.sha256 == digest and (info.path / "pyproject.toml").is_file()
    for source in (str(tree), "https://example.invalid/pytorch.git"):
        with pytest.raises(SourceError, match="torch_sha256 is set, but the source"):
            get_source(good, source, out=io.StringIO())
    with pytest.raises(ProfileError, match="torch_sha256"):
        resolve("cpu", ["torch_sha256=abc"])


def test_tarball_escaping_the_tree_is_refused(tmp_path):
    evil = tmp_path / "evil.tar"
    (tmp_path / "f").write_text("x")
    with tarfile.open(evil, "w") as tar:
        tar.add(tmp_path / "f", arcname="../../escape")
    with pytest.raises(SourceError, match="unsafe"):
        unpack_archive(evil, tmp_path / "srcs")
    assert not list((tmp_path / "srcs").glob("evil*"))


def test_local_dir_must_look_like_a_python_project(tmp_path):
    with pytest.raises(SourceError, match=r"neither setup\.py nor pyproject\.toml"):
        describe_dir(tmp_path)


@pytest.mark.parametrize("cache", [None, "cache"], ids=["shallow", "through a mirror"])
def test_failed_clone_shows_all_of_gits_error(tmp_path, cache):
    missing = (tmp_path / "no-such-repo").as_uri()
    with pytest.raises(SourceError) as exc:
        fetch_git(missing, "v1.0.0", tmp_path / "dest", tmp_path / cache if cache else None)
    msg = exc.value.message
    # git's first line says what is wrong; the last ("and the repository exists.") alone does not
    assert "does not appear to be a git repository" in msg and "Could not read from remote" in msg
    assert not (tmp_path / "dest").exists()


# --------------------------------------------------------------------------- values git would read as options

# (what the user gave, url (a function of the upstream repo and a marker file), ref)
OPTION_LIKE = [
    ("ref --detach", lambda up, m: up.as_uri(), "--detach"),
    ("ref --orphan=evil", lambda up, m: up.as_uri(), "--orphan=evil"),
    ("ref --upload-pack", lambda up, m: up.as_uri(), f"--upload-pack=touch {'{m}'}"),
    ("url --upload-pack", lambda up, m: f"--upload-pack=touch {m};.git", "v1.0.0"),
]


@pytest.mark.parametrize("cache", [None, "cache"], ids=["shallow", "through a mirror"])
@pytest.mark.parametrize(("what", "url", "ref"), OPTION_LIKE, ids=[c[0] for c in OPTION_LIKE])
def test_option_like_url_or_ref_is_refused_before_git_runs(upstream, tmp_path, cache, what, url, ref):
    marker = tmp_path / "ran"
    with pytest.raises(UsageError, match="starts with '-'"):
        fetch_git(url(upstream, marker), ref.replace("{m}", str(marker)), tmp_path / "dest", tmp_path / "cache")
    assert not marker.exists() and not (tmp_path / "dest").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("cache", [None, "cache"], ids=["shallow", "through a mirror"])
@pytest.mark.parametrize(("what", "url", "ref"), OPTION_LIKE, ids=[c[0] for c in OPTION_LIKE])
def test_git_reads_an_option_like_value_as_a_value_even_past_the_refusal(upstream, tmp_path, cache, what, url, ref):
    """The second guard: every user value is placed after `--`/`--end-of-options` (or as
    --opt=value), so git fails on it as a ref or URL instead of obeying it as an option."""
    marker = tmp_path / "ran"
    partial = tmp_path / "partial"
    with pytest.raises(SourceError):
        _clone(
            url(upstream, marker),
            ref.replace("{m}", str(marker)),
            partial,
            tmp_path / cache if cache else None,
            io.StringIO(),
        )
    assert not marker.exists(), "git ran the user's --upload-pack"
    if (partial / ".git").is_dir():  # --detach / --orphan did not check anything out
        assert not (partial / "setup.py").exists()


def test_a_branch_is_checked_out_as_a_tracking_branch_and_a_tag_detached(upstream, tmp_path):
    branch = fetch_git(upstream.as_uri(), "main", tmp_path / "b", tmp_path / "cache")
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=branch.path) == "main"
    assert git("rev-parse", "--abbrev-ref", "main@{upstream}", cwd=branch.path) == "origin/main"
    tag = fetch_git(upstream.as_uri(), "v1.0.0", tmp_path / "t", tmp_path / "cache")
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=tag.path) == "HEAD"


# issue 41 item 2: a tree torchbuild fetches keeps no symlink leading out of it (the tarball rule)
@pytest.mark.parametrize("target", ["/etc", "../../outside", "sub/../../.."], ids=["absolute", "up", "through-sub"])
def test_a_git_tree_with_a_symlink_leading_out_is_refused_and_left_nowhere(upstream, tmp_path, target):
    (upstream / "sub").mkdir()
    (upstream / "sub" / "f").write_text("x\n")
    (upstream / "build").symlink_to(target)
    git("add", "build", "sub", cwd=upstream)
    git("commit", "-q", "-m", "link out", cwd=upstream)
    dest = tmp_path / "out"
    for cache in (None, tmp_path / "cache"):
        with pytest.raises(SourceError, match=r"build is a symlink to .*, outside the tree") as exc:
            fetch_git(upstream.as_uri(), "main", dest, cache)
        assert exc.value.hint and not dest.exists() and not list(tmp_path.glob(".out.partial*"))


def test_a_git_tree_with_a_symlink_inside_is_kept(upstream, tmp_path):
    (upstream / "build").symlink_to("third_party")
    git("add", "build", cwd=upstream)
    git("commit", "-q", "-m", "link in", cwd=upstream)
    info = fetch_git(upstream.as_uri(), "main", tmp_path / "in", None)
    assert (info.path / "build").is_symlink()


def test_an_archive_unpacked_earlier_with_a_link_leading_out_is_refused_when_reused(tmp_path):
    """A tree an older torchbuild unpacked (dpkg-source's was not checked) is checked again."""
    _, tarball = _release_tarball(tmp_path, "pytorch", "setup.py", "# x\n")
    info = unpack_archive(tarball, tmp_path / "srcs")
    (info.path / "build").symlink_to(tmp_path)
    with pytest.raises(SourceError, match=r"unpacked earlier .*: build is a symlink to"):
        unpack_archive(tarball, tmp_path / "srcs")
