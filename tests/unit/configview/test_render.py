"""`invoke config`'s text view: the header comments, the keys as a table (key, value, where it
was set), then the environment the build sees."""

from __future__ import annotations

import re

from torchbuild.configview.render import config_text
from torchbuild.core.arch import Arch
from torchbuild.profile.config import resolve
from torchbuild.runtime.jobs import GiB, HostResources


def test_config_text_is_a_table_of_keys_values_and_origins(tmp_path):
    spec = resolve("gh200", [f"cache_dir={tmp_path}", "max_jobs=3"], host=Arch.AARCH64)
    text = config_text(spec, HostResources(cores=8, memory_bytes=64 * GiB, memory_source="test"))
    lines = text.splitlines()
    assert lines[0].startswith("# profile gh200 (") and lines[0].endswith("gh200.yaml)")
    assert lines[2] == f"# sha256 {spec.hash}"
    assert lines[3].startswith("# image torchbuild/toolchain:gh200-")
    assert lines[4].split() == ["key", "value", "set", "in"]
    table = lines[6 : lines.index("")]
    rows = {ln.split()[0]: ln for ln in table if ln[:2].strip()}  # a key in the first column
    assert "profile" not in rows and set(rows) >= {"description", "cuda_arch_list", "python_packages", "max_jobs"}
    assert rows["cuda_arch_list"].split() == ["cuda_arch_list", '["9.0"]', "gh200.yaml:10"]
    assert rows["max_jobs"].split() == ["max_jobs", "3", "--set"]
    # every origin starts in one column; a long value (python_packages) folds below its row
    column = lines[4].index("set in")
    origin = re.compile(r"((defaults|cpu|cuda|gh200)\.yaml(:\d+)?|--set)")
    assert all(ln[column - 1] == " " and origin.fullmatch(ln[column:]) for ln in rows.values()), rows
    folded = [ln for ln in table if not ln[:2].strip()]
    assert folded and all(len(ln) < column for ln in folded)
    env = lines[lines.index("") + 1 :]
    assert env[0].startswith("# environment the build sees") and "MAX_JOBS=3" in env
