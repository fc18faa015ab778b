# The torchbuild toolchain image: compilers, CMake, Ninja, ccache, Python with PyTorch's
# build requirements, the profile's BLAS/MPI/CUDA packages, and torchbuild itself.
# Every ARG is filled from the resolved profile by `invoke image`; do not edit values here.
ARG BASE_IMAGE=ubuntu:24.04
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION=3.12
# "--system-site-packages" or empty.
ARG VENV_FLAGS=""

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Site CA certificates from the profile's ca_certificates (often none).
COPY certs/ /usr/local/share/ca-certificates/torchbuild/

# The profile's lists, one entry a line: apt-packages.txt (compiler, BLAS, MPI, CUDA, extras),
# requirements.txt (pip requirements, specifiers intact) and apt-options.txt (one word a line:
# `-o`, `Acquire::Check-Valid-Until=false` for snapshot mirrors). mapfile reads them into arrays
# expanded quoted, so no value is split, globbed or interpreted by the shell.
COPY inputs/ /opt/torchbuild/inputs/

RUN mapfile -t apt_options < /opt/torchbuild/inputs/apt-options.txt \
 && mapfile -t apt_packages < /opt/torchbuild/inputs/apt-packages.txt \
 && apt-get "${apt_options[@]}" update \
 && apt-get "${apt_options[@]}" install -y --no-install-recommends \
      ca-certificates git patch make pkg-config ccache cmake ninja-build \
      "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-dev" "python${PYTHON_VERSION}-venv" \
      "${apt_packages[@]}" \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# pip and requests use the system trust store, so site CAs apply to them too.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

# The build venv: `python3` in the image is the profile's Python.
# hadolint ignore=SC2086
RUN "python${PYTHON_VERSION}" -m venv ${VENV_FLAGS} /opt/venv \
 && /opt/venv/bin/python -m pip install --upgrade pip \
 && if [ -s /opt/torchbuild/inputs/requirements.txt ]; then \
      /opt/venv/bin/python -m pip install -r /opt/torchbuild/inputs/requirements.txt; fi
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}

# torchbuild itself, so `torchbuild build` runs inside the image (and the SIF).
COPY torchbuild-src /opt/torchbuild-src
RUN python -m pip install /opt/torchbuild-src \
 && torchbuild --version

# The build's environment (HOME and ccache in the /cache bind...) is set by the backend that
# starts the container (torchbuild.environment), not here.
WORKDIR /src
CMD ["torchbuild", "--help"]
