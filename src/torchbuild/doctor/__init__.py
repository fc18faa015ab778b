"""`invoke doctor`: what this host can do. Other features import only torchbuild.doctor.host (pyproject's import-linter contracts)."""
