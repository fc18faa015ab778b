"""The Apptainer SIF: from the image or from the recipe. Other features import only torchbuild.sif.host (pyproject's import-linter contracts)."""
