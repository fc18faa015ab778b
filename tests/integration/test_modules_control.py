"""runtime_env through real module systems (issue 41 item 1): a value with a line break ran as a
command on `module load` (Environment Modules 5.5 hands pushenv's value to the shell raw, as
Lmod 8.6 does), so a profile's `NCCL_SOCKET_IFNAME: "hsn\\n/path/pwn.sh\\n"` ran pwn.sh on
every load. Each hostile value goes the way `invoke install` takes it (the profile resolved with
--set, runtime_env(), the modulefiles written from it): either it is refused as the profile
resolves, or real Lmod and real Environment Modules load it as the very text it is, and the
script it names never runs."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from helpers import run_in

from torchbuild.core.errors import ProfileError
from torchbuild.install.modulefiles import ModuleInfo, write_modulefiles
from torchbuild.profile.config import resolve
from torchbuild.runtime.environment import runtime_env

pytestmark = pytest.mark.docker

# name: (apt package, its bash init script)
SYSTEMS = {
    "lmod": ("lmod", "/usr/share/lmod/lmod/init/bash"),
    "environment-modules": ("environment-modules", "/usr/share/modules/init/bash"),
}
# what a hostile profile may put in a runtime_env value; {pwn} is a script that leaves a mark
HOSTILE = {
    "newline": "hsn\n{pwn}\n",
    "carriage-return": "hsn\r{pwn}\r",
    "tab": "a\t{pwn}",
    "escape": "a\x1b[31m{pwn}",
    "vertical-tab": "a\x0b{pwn}",
    "command-substitution": "$({pwn})",
    "backticks": "`{pwn}`",
    "semicolons": "x; {pwn}; y",
    "quotes": "it's \"q\" \\ '{pwn}'",
    "lua-and-tcl": "]] .. os.execute('{pwn}') .. [[ [exec {pwn}] ${{x}} {{y}}",
}


def module_image(engine, base_tag: str, package: str) -> str:
    """The bare base with the module system installed (Lmod and Environment Modules conflict in
    Debian: one image each, cached by Docker's layers)."""
    tag = f"torchbuild-test/modules-bare:{package}"
    dockerfile = (
        f"FROM {base_tag}\nUSER 0\nRUN apt-get -o Acquire::Check-Valid-Until=false update -qq"
        f" && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {package} >/dev/null\n"
    )
    engine.client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
    return tag


def _modulefiles(tmp_path: Path, pwn: Path) -> tuple[dict[str, str], list[str]]:
    """The modulefiles of every hostile value the profile takes: ({module: value}, refused)."""
    accepted, refused = {}, []
    for i, (name, template) in enumerate(sorted(HOSTILE.items())):
        value = template.format(pwn=pwn)
        try:
            spec = resolve("cpu", [f"runtime_env.TB_VALUE={value}"], arch="x86_64")
        except ProfileError as exc:
            assert "control character" in exc.message and exc.hint, exc.message
            refused.append(name)
            continue
        info = ModuleInfo(name=f"tb{i}", version="1.0", prefix=str(tmp_path / "env"), env=runtime_env(spec))
        write_modulefiles(tmp_path / "modulefiles", info)
        accepted[f"tb{i}/1.0"] = value
    return accepted, refused


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_a_runtime_env_value_never_runs_on_module_load(engine, local_base, tmp_path, system):
    package, init = SYSTEMS[system]
    tag = module_image(engine, local_base, package)
    mark = tmp_path / "pwned"
    pwn = tmp_path / "pwn.sh"
    pwn.write_text(f"#!/bin/sh\necho ran >> {mark}\n")
    pwn.chmod(0o755)
    accepted, refused = _modulefiles(tmp_path, pwn)
    loads = "\n".join(
        f"module load {m} && printf '<%s>%s<%s>\\n' {m} \"$TB_VALUE\" {m}; module unload {m}" for m in accepted
    )
    script = f"source {init}\nmodule use {tmp_path}/modulefiles\n{loads}\n"
    logs = run_in(engine, tag, script, {str(tmp_path): str(tmp_path)})
    assert not mark.exists(), f"{system} ran a runtime_env value as a command:\n{logs}"
    # every control character is refused before anything is written; the rest is data
    assert sorted(refused) == ["carriage-return", "escape", "newline", "tab", "vertical-tab"]
    for module, value in accepted.items():
        assert f"<{module}>{value}<{module}>" in logs, (module, value, logs)
