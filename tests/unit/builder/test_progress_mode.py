"""invoke build's --progress: decided by the task, handed to the build beside BuildOptions."""

import dataclasses

from invoke.context import Context

from torchbuild.builder import task as build_task
from torchbuild.runtime.options import BuildOptions
from torchbuild.tasks import ns


def test_build_hands_the_progress_mode_it_decided_to_the_build_beside_its_options(monkeypatch):
    """--progress is BuildRun's flag alone: the task decides the mode (auto: bar on a terminal)
    and hands it to the build; BuildOptions holds only the compile's flags."""
    seen: dict[str, object] = {}
    monkeypatch.setattr(build_task.runner, "places", lambda *a: None)  # no tree needed: nothing is built
    monkeypatch.setattr(build_task.runner, "build_pythons", lambda *a, **k: seen.update(k))
    ns["build"].body(Context(), progress="raw")
    assert seen["progress"] == "raw" and seen["options"] == BuildOptions()
    assert "progress" not in {f.name for f in dataclasses.fields(BuildOptions)}
