"""`invoke develop`: editable trees. Other features import only torchbuild.devloop.host (pyproject's import-linter contracts)."""
