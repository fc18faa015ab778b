"""The per-line build requirements (profile/torch_lines.py) and the companion table through torch
2.15, as `invoke config` applies them before any image is built."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

from torchbuild.builder.companion_table import TABLE, default_ref, likely_ref
from torchbuild.core.errors import ProfileError
from torchbuild.profile import torch_lines
from torchbuild.profile.config import profiles_dir, resolve


def test_the_lines_are_in_order_and_no_requirement_ever_goes_down():
    lines = torch_lines.LINES
    assert [torch_lines.version_tuple(line.torch) for line in lines] == sorted(
        torch_lines.version_tuple(line.torch) for line in lines
    )
    for before, after in zip(lines, lines[1:]):
        for field in ("python_min", "gcc_min", "cmake_min", "cuda_min"):
            assert not torch_lines.older(getattr(after, field), getattr(before, field)), (after.torch, field)
    assert lines[-1].torch == "2.15" and lines[-1].backend == "scikit-build-core"


def test_a_torch_newer_than_the_table_takes_the_newest_lines_requirements_and_an_older_none():
    assert torch_lines.line_of("2.16.0") == torch_lines.LINES[-1] and torch_lines.newest_known("2.16.0")
    assert torch_lines.line_of("2.6.0a0+git1234").torch == "2.6"
    assert torch_lines.line_of("", "main") == torch_lines.LINES[-1]
    assert torch_lines.line_of("1.13.1") is None and torch_lines.line_of("not-a-version") is None


@pytest.mark.parametrize(
    ("sets", "key", "words"),
    [
        # Python 3.10 for 2.15, whose floor is 3.11 (pytorch/pytorch#197242)
        (["torch_version=2.15.0", "python_version=3.10"], "python_version", "needs Python >= 3.11"),
        # Ubuntu 20.04's GCC 9.4 for a C++20 torch
        (["torch_version=2.13.0", "base_image=ubuntu:20.04"], "base_image", "GCC 9.4 (the gcc of ubuntu:20.04)"),
        (["torch_version=2.15.0", "compiler_version=10"], "compiler_version", "GCC 10 is older than PyTorch 2.15"),
        # a torch newer than the table is held to the newest line's floors
        (["torch_version=2.16.0", "compiler_version=10"], "compiler_version", "needs: GCC >= 11.3 (C++20)"),
    ],
)
def test_config_refuses_a_toolchain_older_than_the_torch_line_needs(sets, key, words):
    with pytest.raises(ProfileError, match=f"key '{key}'") as err:
        resolve("cpu", sets, arch="x86_64")
    assert words in err.value.message


def test_config_refuses_a_cuda_older_than_the_torch_line_builds_with():
    base = "base_image=nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04"
    with pytest.raises(ProfileError, match=r"key 'cuda_version': CUDA 11\.8 is older than PyTorch 2\.12"):
        resolve("cuda", [base, "cuda_version=11.8", "torch_version=2.12.0"], arch="x86_64")
    assert resolve("cuda", [base, "cuda_version=11.8", "torch_version=2.6.0"], arch="x86_64").cuda_version == "11.8"


def test_what_each_line_accepts_resolves():
    assert resolve("cpu", ["torch_version=2.13.0", "base_image=ubuntu:22.04"], arch="x86_64").torch_version == "2.13.0"
    assert resolve("archer2", []).torch_version == "2.9.1"  # EPCC's; focal's GCC 9.4 meets 2.9's 9.3
    with pytest.raises(ProfileError, match=r"GCC 9\.4 .* older than PyTorch 2\.15"):
        resolve("archer2", ["torch_version=2.15.0"])


def test_the_companion_table_runs_through_2_15_with_torchaudio_ending_at_2_11():
    assert TABLE["2.15"] == {"torchvision": "0.30"} and TABLE["2.11"]["torchaudio"] == "2.11"
    assert default_ref("torchvision", "2.15.1") == "v0.30.1"
    for line, row in TABLE.items():  # the rule the error for a newer torch offers holds for every row
        assert likely_ref("torchvision", f"{line}.0") == f"v{row['torchvision']}.0"
    with pytest.raises(
        ProfileError, match=r"torchaudio has no release for torch 2\.13: its last line goes with torch 2\.11"
    ):
        resolve("cpu", ["torch_version=2.13.0", "base_image=ubuntu:22.04", "companions=[torchaudio]"])


def test_a_torch_newer_than_the_table_needs_the_companion_ref_named_never_a_guess():
    sets = ["torch_version=2.16.0", "companions=[torchvision]"]
    with pytest.raises(ProfileError, match="newer than the companion table") as err:
        resolve("cpu", sets)
    assert "--set companion_refs.torchvision=v0.31.0" in err.value.message
    assert "companion_refs" in err.value.hint
    spec = resolve("cpu", [*sets, "companion_refs.torchvision=v0.31.0"])
    assert spec.companion_refs == {"torchvision": "v0.31.0"}


def _torch_column(doc: str, header: str) -> dict[str, str]:
    """{profile: torch} from the table under `header` in a Markdown file of the repository."""
    text = (REPO / doc).read_text()
    rows = text[text.index(header) :].split("\n\n", 1)[0].splitlines()[2:]
    return {m[1]: m[2] for row in rows if (m := re.match(r"\| `([a-z0-9-]+)` \| ([0-9.]+) \|", row))}


def test_the_default_builds_the_newest_line_and_the_docs_name_each_shipped_profiles_torch():
    """The default profile builds the current release (the newest line known); each shipped profile's
    torch version is what the README's and the profiles page's tables say (a pin moved without
    them, or a new profile left out, fails here)."""
    assert torch_lines.line_of(resolve("cpu").torch_version) is torch_lines.LINES[-1]
    shipped = sorted(p.stem for p in profiles_dir().glob("*.yaml"))
    versions = {name: resolve(name).torch_version for name in shipped}
    assert _torch_column("README.md", "| profile | torch |") == versions
    assert _torch_column("docs/profiles.md", "| profile | torch |") == versions
