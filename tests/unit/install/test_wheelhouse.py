"""The wheelhouse with real (minimal) wheels: its PEP 503 index, real pip installing from it
(--find-links and --index-url file://), the local-version and same-name conflicts, and the
`torchbuild wheelhouse` task's exit codes."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse
from urllib.request import url2pathname

import pytest
from helpers import TORCH_TAG, make_wheel

from torchbuild.core.errors import InsufficientSpace, PathError, UsageError, WheelError, WheelhouseConflict
from torchbuild.install.wheelhouse import add_wheels, wheels_in

TORCHBUILD = Path(sys.executable).with_name("torchbuild")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs.append(dict(attrs)["href"])


def hrefs(page: Path) -> list[str]:
    parser = _Links()
    parser.feed(page.read_text())
    return parser.hrefs


def listing(dest: Path) -> dict[str, str]:
    """Every file under dest (relative path -> sha256): what a failed call must leave alone."""
    return {str(p.relative_to(dest)): sha256(p) for p in sorted(dest.rglob("*")) if p.is_file()}


def pip_env(tmp_path: Path) -> dict[str, str]:
    """This machine's pip configuration (find-links, extra indexes) left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        {
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_CACHE_DIR": str(tmp_path / "pipcache"),
        }
    )
    return env


# --------------------------------------------------------------------------- the index


def test_add_wheels_writes_a_simple_index_with_checked_links(tmp_path):
    src = tmp_path / "out"
    torch = make_wheel(src, "torch", "2.6.0+cpu", TORCH_TAG)
    foo = make_wheel(src, "Foo_Bar", "1.0")
    dest = tmp_path / "house"
    added = add_wheels(dest, [torch, foo])
    assert sorted(p.name for p in added) == sorted([torch.name, foo.name])
    root = dest / "simple" / "index.html"
    assert sorted(hrefs(root)) == ["foo-bar/", "torch/"]  # PEP 503 normalized project names
    assert 'name="pypi:repository-version"' in root.read_text()
    for project, wheel in (("foo-bar", foo), ("torch", torch)):
        page = dest / "simple" / project / "index.html"
        (href,) = hrefs(page)
        url, fragment = urldefrag(href)
        target = Path(url2pathname(urlparse(urljoin(page.as_uri(), url)).path))
        assert target == dest / wheel.name and target.is_file()
        assert fragment == f"sha256={sha256(wheel)}"
        assert sha256(target) == sha256(wheel)
    assert not [p for p in dest.rglob(".partial-*")]


def test_index_leaves_out_partial_copies_and_drops_pages_of_removed_projects(tmp_path):
    dest = tmp_path / "house"
    add_wheels(dest, [make_wheel(tmp_path / "a", "oldproj", "1.0")])
    (dest / "oldproj-1.0-py3-none-any.whl").unlink()
    partial = make_wheel(tmp_path / "b", "halfway", "1.0")
    partial.rename(dest / f".partial-1234abcd-{partial.name}")  # what an interrupted copy leaves
    add_wheels(dest, [make_wheel(tmp_path / "c", "newproj", "2.0")])
    assert hrefs(dest / "simple" / "index.html") == ["newproj/"]
    assert not (dest / "simple" / "oldproj").exists()
    assert [w.path.name for w in wheels_in(dest)] == ["newproj-2.0-py3-none-any.whl"]


def _foreign_page(simple: Path) -> Path:
    page = simple / "numpy" / "index.html"  # another project's page, written by another tool
    page.parent.mkdir()
    page.write_text('<html><body><a href="https://mirror.example/numpy-2.0.0.whl">numpy</a></body></html>\n')
    return page


def _users_file(simple: Path) -> Path:
    kept = simple / "private" / "keep.txt"
    kept.parent.mkdir()
    kept.write_text("mine")
    return kept


def _stale_page(simple: Path) -> None:
    """Our page of a project whose wheel is no longer in the wheelhouse (the sweep's case)."""
    dest = simple.parent
    add_wheels(dest, [make_wheel(dest.parent / "old", "oldproj", "1.0")])
    (dest / "oldproj-1.0-py3-none-any.whl").unlink()


def _page_beside_a_file(simple: Path) -> Path:
    """A page like ours, in a directory that also holds a file of the user's."""
    _stale_page(simple)
    kept = simple / "oldproj" / "notes.txt"
    kept.write_text("mine")
    return kept


def _edited_page(simple: Path) -> Path:
    """A page like ours that the user edited (a link of their own added)."""
    _stale_page(simple)
    page = simple / "oldproj" / "index.html"
    page.write_text(
        page.read_text().replace("  </body>", '    <a href="https://example.org/x.whl">x</a><br>\n  </body>')
    )
    return page


@pytest.mark.parametrize("theirs", [_foreign_page, _users_file, _page_beside_a_file, _edited_page])
def test_index_sweep_leaves_what_torchbuild_did_not_write(tmp_path, theirs):
    dest = tmp_path / "house"
    add_wheels(dest, [make_wheel(tmp_path / "a", "torch", "2.6.0+cpu", TORCH_TAG)])
    kept = theirs(dest / "simple")
    content = kept.read_text()
    add_wheels(dest, [make_wheel(tmp_path / "b", "newproj", "2.0")])
    assert kept.read_text() == content
    assert sorted(hrefs(dest / "simple" / "index.html")) == ["newproj/", "torch/"]


def test_index_is_not_written_through_a_symbolic_link_out_of_the_wheelhouse(tmp_path):
    dest = tmp_path / "house"
    add_wheels(dest, [make_wheel(tmp_path / "a", "numpy", "2.0.0")])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dest / "simple" / "torch").symlink_to(elsewhere)
    with pytest.raises(PathError, match="symbolic link"):
        add_wheels(dest, [make_wheel(tmp_path / "b", "torch", "2.6.0+cpu", TORCH_TAG)])
    assert list(elsewhere.iterdir()) == []
    assert [w.project for w in wheels_in(dest)] == ["numpy"]  # nothing half added


@pytest.mark.parametrize("how", ["find-links", "index-url"])
def test_pip_installs_from_the_wheelhouse(tmp_path, how):
    wheel = make_wheel(tmp_path / "out", "tb_house", "1.0+cpu", module="tb_house")
    dest = tmp_path / "house"
    add_wheels(dest, [wheel])
    if how == "find-links":
        where = ["--no-index", "--find-links", str(dest)]
    else:
        where = ["--index-url", (dest / "simple").as_uri()]
    target = tmp_path / "target"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), *where, "tb-house==1.0+cpu"],
        env=pip_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "tb_house" / "__init__.py").read_text().startswith('__version__ = "1.0+cpu"')


# --------------------------------------------------------------------------- conflicts


@pytest.mark.parametrize(
    ("first", "second"),
    [("2.6.0+cpu", "2.6.0+gh200"), ("2.6.0+cpu", "2.6.0"), ("2.6.0", "2.5.1+cpu")],
)
def test_mixing_local_versions_is_refused_and_nothing_is_copied(tmp_path, first, second):
    dest = tmp_path / "house"
    add_wheels(dest, [make_wheel(tmp_path / "a", "torch", first, TORCH_TAG)])
    before = listing(dest)
    other = make_wheel(tmp_path / "b", "torch", second, TORCH_TAG)
    with pytest.raises(WheelhouseConflict, match="mix local versions of torch") as info:
        add_wheels(dest, [other])
    assert info.value.status == 23
    assert listing(dest) == before


def test_mixing_local_versions_in_one_call_copies_nothing(tmp_path):
    dest = tmp_path / "house"
    cpu = make_wheel(tmp_path / "a", "torch", "2.6.0+cpu", TORCH_TAG)
    gh = make_wheel(tmp_path / "a", "torch", "2.6.0+gh200", "cp313-cp313-linux_aarch64")
    with pytest.raises(WheelhouseConflict):
        add_wheels(dest, [cpu, gh])
    assert not dest.exists() or wheels_in(dest) == []
    assert not (dest / "simple").exists()


def test_mixing_local_versions_is_allowed_when_asked(tmp_path):
    dest = tmp_path / "house"
    cpu = make_wheel(tmp_path / "a", "torch", "2.6.0+cpu", TORCH_TAG)
    gh = make_wheel(tmp_path / "a", "torch", "2.6.0+gh200", "cp313-cp313-linux_aarch64")
    add_wheels(dest, [cpu])
    add_wheels(dest, [gh], allow_mixed=True)
    assert sorted(hrefs(dest / "simple" / "torch" / "index.html")) == sorted(
        f"../../{w.name}#sha256={sha256(w)}" for w in (cpu, gh)
    )


def test_several_public_versions_with_one_local_label_are_fine(tmp_path):
    dest = tmp_path / "house"
    add_wheels(dest, [make_wheel(tmp_path / "a", "torch", "2.5.1+cpu", TORCH_TAG)])
    add_wheels(dest, [make_wheel(tmp_path / "b", "torch", "2.6.0+cpu", TORCH_TAG)])
    assert [str(w.version) for w in wheels_in(dest)] == ["2.5.1+cpu", "2.6.0+cpu"]
    assert len(hrefs(dest / "simple" / "torch" / "index.html")) == 2


def test_same_name_other_content_is_a_conflict_and_same_content_is_kept(tmp_path):
    dest = tmp_path / "house"
    first = make_wheel(tmp_path / "a", "torch", "2.6.0+cpu", TORCH_TAG, salt="build 1")
    add_wheels(dest, [first])
    before = listing(dest)
    rebuilt = make_wheel(tmp_path / "b", "torch", "2.6.0+cpu", TORCH_TAG, salt="build 2")
    with pytest.raises(WheelhouseConflict, match="already holds a different"):
        add_wheels(dest, [rebuilt])
    assert listing(dest) == before  # the published wheel is untouched
    copy = tmp_path / "c" / first.name
    copy.parent.mkdir()
    copy.write_bytes(first.read_bytes())
    assert add_wheels(dest, [copy]) == []  # the same wheel again: nothing to add
    assert listing(dest) == before


def test_two_different_wheels_with_one_name_in_one_call_are_a_conflict(tmp_path):
    dest = tmp_path / "house"
    one = make_wheel(tmp_path / "a", "torch", "2.6.0+cpu", TORCH_TAG, salt="build 1")
    two = make_wheel(tmp_path / "b", "torch", "2.6.0+cpu", TORCH_TAG, salt="build 2")
    with pytest.raises(WheelhouseConflict):
        add_wheels(dest, [one, two])


@pytest.mark.parametrize("together", [True, False], ids=["one call", "two calls"])
def test_one_version_for_two_pythons_is_one_wheelhouse(tmp_path, together):
    """What `invoke build --python 3.13,3.14` writes: each interpreter installs only its own."""
    dest = tmp_path / "house"
    cp313 = make_wheel(tmp_path / "a", "torch", "2.6.0+cpu", "cp313-cp313-linux_x86_64")
    cp314 = make_wheel(tmp_path / "a", "torch", "2.6.0+cpu", "cp314-cp314-linux_x86_64")
    if together:
        add_wheels(dest, [cp313, cp314])
    else:
        add_wheels(dest, [cp313])
        add_wheels(dest, [cp314])
    assert sorted(w.path.name for w in wheels_in(dest)) == sorted([cp313.name, cp314.name])
    assert len(hrefs(dest / "simple" / "torch" / "index.html")) == 2


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("cp313-cp313-linux_x86_64", "1-cp313-cp313-linux_x86_64"),  # a build number apart
        ("py3-none-any", "py2.py3-none-any"),  # compressed tags that share one
    ],
)
def test_two_wheels_of_one_version_for_the_same_python_and_platform_are_refused(tmp_path, first, second):
    dest = tmp_path / "house"
    add_wheels(dest, [make_wheel(tmp_path / "a", "torch", "2.6.0+cpu", first)])
    before = listing(dest)
    with pytest.raises(WheelhouseConflict, match=r"two wheels of torch 2\.6\.0\+cpu for "):
        add_wheels(dest, [make_wheel(tmp_path / "b", "torch", "2.6.0+cpu", second)])
    assert listing(dest) == before


def _not_a_zip(d: Path) -> Path:
    d.mkdir(parents=True)
    p = d / "torch-2.6.0+cpu-cp313-cp313-linux_x86_64.whl"
    p.write_text("<html>404 Not Found</html>")  # what a failed download leaves
    return p


def _zip_without_wheel(d: Path) -> Path:
    d.mkdir(parents=True)
    p = d / "torch-2.6.0+cpu-cp313-cp313-linux_x86_64.whl"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("torch/__init__.py", "")
    return p


def _bad_name(d: Path) -> Path:
    return make_wheel(d, "torch", "2.6.0", TORCH_TAG).rename(d / "torch-latest.whl")


@pytest.mark.parametrize("bad", [_not_a_zip, _zip_without_wheel, _bad_name])
def test_a_file_that_is_no_wheel_is_refused_before_anything_is_copied(tmp_path, bad):
    dest = tmp_path / "house"
    good = make_wheel(tmp_path / "good", "numpy", "2.0.0")
    with pytest.raises(WheelError) as info:
        add_wheels(dest, [good, bad(tmp_path / "bad")])
    assert info.value.status == 18
    assert not dest.exists()


def _disk_full_after(monkeypatch, copies: int) -> None:
    """shutil.copyfile fails as it does on a full file system after `copies` copies: ENOSPC
    naming the source in filename and the destination in filename2."""
    real = shutil.copyfile
    done = []

    def copyfile(src, dst, **kwargs):
        if len(done) >= copies:
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))
        done.append(dst)
        return real(src, dst, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", copyfile)


@pytest.mark.parametrize("dest_was", ["new", "new and nested", "a wheelhouse"])
@pytest.mark.parametrize("copies", [0, 1])
def test_a_full_disk_names_the_wheelhouse_and_leaves_it_as_it_was(tmp_path, monkeypatch, dest_was, copies):
    dest = tmp_path / "house" if dest_was != "new and nested" else tmp_path / "a" / "b" / "house"
    if dest_was == "a wheelhouse":
        add_wheels(dest, [make_wheel(tmp_path / "old", "numpy", "2.0.0")])
    before = listing(dest) if dest.exists() else None
    src = tmp_path / "src-dir"
    wheels = [make_wheel(src, "torch", "2.6.0+cpu", TORCH_TAG), make_wheel(src, "tb_other", "1.0")]
    _disk_full_after(monkeypatch, copies)
    with pytest.raises(InsufficientSpace) as info:
        add_wheels(dest, wheels, link=False)
    assert info.value.status == 12
    assert str(dest) in info.value.message and str(src) not in info.value.message
    if before is None:
        assert not dest.exists() and not (tmp_path / "a").exists()
    else:
        assert listing(dest) == before


def test_no_wheels_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no wheels"):
        add_wheels(tmp_path / "house", [])
    assert not (tmp_path / "house").exists()


# --------------------------------------------------------------------------- the task


def _torchbuild(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TORCHBUILD), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_wheelhouse_task_adds_the_wheels_and_exits_23_on_a_conflict(tmp_path):
    cpu = make_wheel(tmp_path / "out", "torch", "2.6.0+cpu", TORCH_TAG)
    ok = _torchbuild("wheelhouse", "--dest", "house", "--wheel", str(cpu), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"added {cpu.name}" in ok.stdout
    assert f"1 wheels in {tmp_path / 'house'}" in ok.stdout
    assert (tmp_path / "house" / "simple" / "torch" / "index.html").is_file()

    gh = make_wheel(tmp_path / "other", "torch", "2.6.0+gh200", TORCH_TAG)
    bad = _torchbuild("wheelhouse", "--dest", "house", "--wheel", str(gh), cwd=tmp_path)
    assert bad.returncode == 23
    assert "error: WheelhouseConflict" in bad.stderr and "Traceback" not in bad.stdout + bad.stderr
    assert "--mix-local-versions" in bad.stderr  # the hint says how to allow it
    assert not (tmp_path / "house" / gh.name).exists()


def test_wheelhouse_task_takes_every_wheel_in_out_by_default(tmp_path):
    make_wheel(tmp_path / "out", "torch", "2.6.0+cpu", TORCH_TAG)
    make_wheel(tmp_path / "out", "torchvision", "0.21.0+cpu", TORCH_TAG)
    done = _torchbuild("wheelhouse", "--dest", "house", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(hrefs(tmp_path / "house" / "simple" / "index.html")) == ["torch/", "torchvision/"]
    empty = _torchbuild("wheelhouse", "--dest", "house2", "--out", "nothing-here", cwd=tmp_path)
    assert empty.returncode == 2 and "error: UsageError" in empty.stderr and "Traceback" not in empty.stderr
