"""Torch's build: the launch path, the build step, its helpers, companions, manifest show/diff. Other features import only torchbuild.builder.host (pyproject's import-linter contracts)."""
