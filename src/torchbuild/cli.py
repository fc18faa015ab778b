"""The `torchbuild` console script: the same Invoke collection as `invoke` on the host, so every
task and option exists inside the toolchain image and the SIF too (`apptainer run
torch-build.sif build --preflight` is `invoke build --preflight` run in the SIF)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from invoke.program import Program

from torchbuild import __version__

EPILOG = """
In the toolchain SIF (its runscript is this program), bind the tree, the cache and the output:
  apptainer run --bind SRC:/src,CACHE:/cache[,OUT:/out] [--nv] torch-build.sif build --preflight
  /src    the PyTorch tree, read-write (patched in place; build/ is written there)
  /cache  ccache and pip cache: keep it between runs
  /out    wheel, manifest and logs (default ./out in the current directory)
  --nv    on GPU nodes, brings the NVIDIA driver into the SIF
`apptainer run-help torch-build.sif` shows the SIF's profile; `torchbuild --help build` every build option."""


class TorchbuildProgram(Program):
    """invoke's Program with the binds explained under the core help."""

    def print_help(self) -> None:
        super().print_help()
        print(EPILOG.strip("\n"))


def program() -> Program:
    from torchbuild.runtime.tasks import PROGRAM
    from torchbuild.tasks import ns

    PROGRAM["binary"] = "torchbuild"
    return TorchbuildProgram(namespace=ns, version=__version__, name="torchbuild", binary="torchbuild")


def main(argv: Sequence[str] | None = None) -> int:
    args = ["torchbuild", *(sys.argv[1:] if argv is None else argv)]
    try:
        program().run(args, exit=True)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
