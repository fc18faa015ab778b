#!/bin/bash
# The profile's cuda_version against the image's nvcc: cuda-check.sh CUDA_VERSION CUDA_HOME.
# cuda_version names the CUDA a wheel is built with (its manifest, the profile's hash): an nvcc
# of another release would build something else under that name, so the image build stops
# here, before any compile, with a line `invoke image` turns into a ProfileError. An empty
# CUDA_VERSION is a CPU build: nothing to check.
set -uo pipefail
want=${1:-}
home=${2:-/usr/local/cuda}
[ -n "$want" ] || exit 0
nvcc="$home/bin/nvcc"
if ! said=$("$nvcc" --version 2>&1); then
  printf 'torchbuild-cuda: cuda_version is %s, and %s does not run (%s)\n' "$want" "$nvcc" "$(printf '%s' "$said" | tail -n 1)"
  exit 1
fi
# "Cuda compilation tools, release 12.6, V12.6.85"
have=$(printf '%s\n' "$said" | sed -n 's/.*[Rr]elease \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1)
if [ "$have" != "$want" ]; then
  printf 'torchbuild-cuda: cuda_version is %s, and the image'"'"'s nvcc (%s) is CUDA %s\n' "$want" "$nvcc" "${have:-of no release it names}"
  exit 1
fi
printf 'torchbuild-cuda: %s is CUDA %s, as cuda_version says\n' "$nvcc" "$have"
