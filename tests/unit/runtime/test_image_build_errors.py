"""A failed image build names the step in one line (issue 27 item 28): the step's number, its
instruction and the start of its command, and the exit code; the whole multi-line RUN block
and its output stay in the log the message names."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchbuild.core.errors import ImageBuildFailed
from torchbuild.runtime.engine import Engine

RUN_BLOCK = (
    "/bin/sh -c set -eux;     apt-get update;     apt-get install -y --no-install-recommends gcc g++ "
    "libopenblas-dev python3.12-dev;     rm -rf /var/lib/apt/lists/*"
)


def _engine(chunks: list[dict[str, object]]) -> Engine:
    api = SimpleNamespace(build=lambda **kwargs: iter(chunks))
    return Engine(client=SimpleNamespace(api=api))


def test_a_failed_run_step_is_named_in_one_line(tmp_path: Path):
    block = RUN_BLOCK.replace(";", ";\n")
    error = f"The command '{block}' returned a non-zero code: 100"
    chunks = [
        {"stream": "Step 1/9 : FROM ubuntu:24.04\n"},
        {"stream": "Step 7/9 : RUN set -eux; \\\n    apt-get update; \\\n    apt-get install -y gcc\n"},
        {"stream": "E: Unable to locate package gcc\n"},
        {"error": error},
    ]
    log = tmp_path / "image.log"
    with pytest.raises(ImageBuildFailed) as exc:
        _engine(chunks).build(tmp_path, tag="tb:cpu", log=log, out=io.StringIO())
    message = exc.value.message
    assert "\n" not in message and len(message) < 300, message
    assert "step 7/9 (RUN set -eux;" in message and "exited with code 100" in message
    assert str(log) in message and "rm -rf /var/lib/apt/lists" not in message
    assert "rm -rf /var/lib/apt/lists" in log.read_text(), "the whole block is in the log"


def test_an_error_without_a_step_keeps_its_first_line(tmp_path: Path):
    chunks = [{"error": "no space left on device\nwhile writing layer " + "x" * 500}]
    with pytest.raises(ImageBuildFailed) as exc:
        _engine(chunks).build(tmp_path, tag="tb:cpu", log=tmp_path / "l.log", out=io.StringIO())
    assert "no space left on device" in exc.value.message and "\n" not in exc.value.message
    assert "xxxx" not in exc.value.message
