"""Install environments, modulefiles, mpi-check, wheelhouses. Other features import only torchbuild.install.host (pyproject's import-linter contracts)."""
