"""The registry of named errors (errors.ERRORS): it holds every TorchbuildError subclass of the
package, each exit code names one class (or a documented few), a step's exit code maps back to
its class whatever modules are imported. The docs' error table is generated from ERRORS
(tests/unit/repo/test_docs.py checks it lists them all)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import torchbuild
from torchbuild.core import errors
from torchbuild.core.errors import (
    ERRORS,
    SHARED_EXITS,
    LockError,
    ManifestError,
    PathError,
    ProfileError,
    RecipeError,
    TooLarge,
    TorchbuildError,
    UsageError,
    error_for_exit,
)

REPO = Path(__file__).resolve().parents[3]


def _every_subclass(cls: type[TorchbuildError]) -> set[type[TorchbuildError]]:
    return {c for sub in cls.__subclasses__() for c in (sub, *_every_subclass(sub))}


def test_the_registry_holds_every_named_error_of_the_package():
    for info in pkgutil.walk_packages(torchbuild.__path__, "torchbuild."):
        importlib.import_module(info.name)
    defined = {c for c in _every_subclass(TorchbuildError) if c.__module__.startswith("torchbuild")}
    assert len(ERRORS) == len(set(ERRORS)), "a class is listed twice in errors.ERRORS"
    missing = sorted(c.__qualname__ + " in " + c.__module__ for c in defined - set(ERRORS))
    assert not missing, f"errors.ERRORS lacks {missing}: define the class in errors.py and list it there"
    assert set(ERRORS) <= defined
    assert all(c.__module__ == "torchbuild.core.errors" for c in ERRORS)


def test_the_moved_classes_are_still_importable_from_their_old_modules():
    from torchbuild.core.safeio import TooLarge as too_large
    from torchbuild.image.lock import LockError as lock_error
    from torchbuild.runtime.manifest import READ_HINT
    from torchbuild.runtime.manifest import ManifestError as manifest_error
    from torchbuild.sif.recipe import RecipeError as recipe_error

    assert (lock_error, manifest_error, recipe_error, too_large) == (LockError, ManifestError, RecipeError, TooLarge)
    assert ManifestError.default_hint == READ_HINT


def test_exit_codes_are_unique_but_for_the_documented_sharing():
    counts = Counter(c.exit_code for c in ERRORS)
    shared = {code for code, n in counts.items() if n > 1}
    assert shared == set(SHARED_EXITS) == {2, 15}
    assert {c for c in ERRORS if c.exit_code == 2} == {ProfileError, UsageError}
    assert {c for c in ERRORS if c.exit_code == 15} == {PathError, TooLarge}
    assert 0 not in counts and 1 not in counts  # success, and a crash or a plain TorchbuildError
    assert all(0 < code < 256 for code in counts)


def test_every_exit_code_maps_back_to_its_class():
    for cls in ERRORS:
        expected = SHARED_EXITS.get(cls.exit_code, cls)
        assert error_for_exit(cls.exit_code) is expected, cls.__name__
    assert error_for_exit(2) is ProfileError
    assert error_for_exit(15) is PathError
    for code in (0, 1, 99, 255, -9):
        assert error_for_exit(code) is None


def test_an_undocumented_shared_code_is_refused(monkeypatch):
    class Clash(TorchbuildError):
        exit_code = LockError.exit_code

    monkeypatch.setattr(errors, "ERRORS", (*ERRORS, Clash))
    with pytest.raises(RuntimeError, match="exit code 28 is shared by LockError, Clash"):
        errors._exit_map()


FRESH = """
import sys
from pathlib import Path
import torchbuild.core.errors, torchbuild.runtime.backends
assert not {"torchbuild.image.lock", "torchbuild.sif.recipe", "torchbuild.runtime.manifest"} & set(sys.modules)
for rc in (28, 29, 19):
    print(rc, torchbuild.core.errors.error_for_exit(rc).__name__,
          type(torchbuild.runtime.backends.failure(rc, "verify", "the image", Path("logs"))).__name__)
"""


def test_a_fresh_interpreter_maps_lock_recipe_and_manifest_codes_without_their_modules():
    done = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "28 LockError LockError",
        "29 RecipeError RecipeError",
        "19 ManifestError ManifestError",
    ]


# issue 41 item 4: a named error quotes file names, logs and tools' words: shown inert
def test_report_shows_escape_sequences_in_a_message_and_hint_inert(capsys):
    from torchbuild.core.errors import SourceError, report

    err = SourceError("source archive /tmp/\x1b]0;pwned\x07\x1b[2Ja.tar.gz does not exist", hint="try \x1b[31mred")
    assert report(err) == 8
    shown = capsys.readouterr().err
    assert "\x1b" not in shown and "\x07" not in shown and "pwned" not in shown
    assert shown == "error: SourceError: source archive /tmp/a.tar.gz does not exist\nhint: try red\n"
