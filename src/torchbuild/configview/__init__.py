"""`invoke config`: the resolved profile shown, and when not to build. Other features import only torchbuild.configview.need_build (pyproject's import-linter contracts)."""
