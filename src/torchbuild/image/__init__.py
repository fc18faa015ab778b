"""The toolchain image: build, lock, push; local Debian base images. Other features import only torchbuild.image.host (pyproject's import-linter contracts)."""
