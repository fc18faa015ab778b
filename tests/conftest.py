"""Settings for every test session (unit, integration, slow)."""

from __future__ import annotations

import signal

# as every entry point does before a task runs (tasks.py, cli.program): the Collection hands the
# runtime what it needs from the features (core/handover.py), so tests that call a backend or
# a step directly see the same runtime as `invoke` and `torchbuild`
import torchbuild.tasks  # noqa: F401


def pytest_configure(config) -> None:
    """Ctrl-C as a terminal gives it. A runner started in the background by a shell without job
    control (`nohup .ci/run &`, some CI agents) starts with SIGINT ignored; Python then never
    raises KeyboardInterrupt, and every process a test starts inherits the ignored signal, so the
    tests of what SIGINT does (an interrupted build, probe or job) saw nothing and failed. The
    default handler is put back here, in pytest-xdist's workers too; programs the tests start
    then get SIGINT's default action again."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
