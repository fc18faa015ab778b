"""`invoke config` shows the values the build derives for keys left empty (issue 27 item 33):
the companions' refs from torch_version through the companion table, their repositories,
torch_ref; marked as derived, in the text and the JSON views, like the environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchbuild.configview.render import config_data, config_text
from torchbuild.profile.config import resolve
from torchbuild.runtime.jobs import GiB, HostResources

HOST = HostResources(cores=8, memory_bytes=64 * GiB, memory_source="test")
REPO = Path(__file__).resolve().parents[3]


def _derived_rows(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    start = lines.index("# derived: what the build uses for keys left empty")
    rows = lines[start + 3 :]
    return {ln.split()[0]: ln.split() for ln in rows}


def test_companion_refs_derived_from_torch_version_are_shown_marked_as_derived(tmp_path):
    spec = resolve("cpu", ["torch_version=2.5.1", "companions=torchvision,torchaudio", f"cache_dir={tmp_path}"])
    rows = _derived_rows(config_text(spec, HOST))
    assert rows["companion_refs.torchvision"][:3] == ["companion_refs.torchvision", '"v0.20.1"', "derived:"]
    assert "torch_version 2.5.1" in " ".join(rows["companion_refs.torchvision"])
    assert rows["companion_refs.torchaudio"][1] == '"v2.5.1"'
    assert rows["companion_repos.torchvision"][1] == '"https://github.com/pytorch/vision.git"'
    assert rows["torch_ref"][1:3] == ['"v2.5.1"', "derived:"]


def test_derived_values_are_in_the_json_view(tmp_path):
    spec = resolve("cpu", ["torch_version=2.5.1", "companions=torchvision", f"cache_dir={tmp_path}"])
    data = json.loads(json.dumps(config_data(spec, HOST)))
    assert data["derived"]["companion_refs.torchvision"] == {
        "value": "v0.20.1",
        "from": "torch_version 2.5.1 (companion table)",
    }
    assert data["values"]["companion_refs"] == {}, "the profile's own values stay as the profile has them"


@pytest.mark.parametrize(
    ("sets", "shown", "hidden"),
    [
        (
            ["companions=torchvision", "companion_refs.torchvision=v0.20.0"],
            {"companion_repos.torchvision"},
            {"companion_refs.torchvision"},
        ),
        (["companions=torchvision", "torch_ref=main"], {"companion_refs.torchvision"}, {"torch_ref"}),
        ([], {"torch_ref"}, {"companion_refs.torchvision", "companion_repos.torchvision"}),
    ],
    ids=["a ref the profile sets is not derived", "torch main gives main", "no companions, no companion rows"],
)
def test_only_keys_left_empty_are_derived(tmp_path, sets, shown, hidden):
    data = config_data(resolve("cpu", [*sets, f"cache_dir={tmp_path}"]), HOST)
    assert shown <= set(data["derived"]) and not hidden & set(data["derived"])
    if "torch_ref=main" in sets:
        assert data["derived"]["companion_refs.torchvision"] == {
            "value": "main",
            "from": "torch_ref main (companion table)",
        }


def test_invoke_config_prints_the_derived_companion_ref(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "invoke", "config", "--set", "torch_version=2.5.1", "--set", "companions=torchvision",
         "--set", f"cache_dir={tmp_path}"],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert _derived_rows(res.stdout)["companion_refs.torchvision"][1] == '"v0.20.1"'
