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
# requirements.txt (pip requirements, specifiers intact), pythons.txt (python_version, then
# python_versions' others) and apt-options.txt (one word a line: `-o`,
# `Acquire::Check-Valid-Until=false` for snapshot mirrors). With a lock (`invoke image --lock`),
# lock/apt.txt (name=version pins) and lock/pip-<version>.txt (pinned, hashed requirements).
# mapfile reads them into arrays expanded quoted, so no value is split, globbed or interpreted
# by the shell; pip reads the requirement files itself.
COPY inputs/ /opt/torchbuild/inputs/

# apt. Unlocked: the fixed tools, python<v>, -dev and -venv for each Python, the profile's
# packages. Locked: exactly the lock's pins (dependencies included, so nothing else is chosen).
# record/dpkg-base.txt (the base image's packages) is what `invoke image --lock` subtracts.
# A Python the archive lacks (3.12 on a glibc 2.31 base) comes from python-sources.txt
# (python_sources: version, URL, sha256 a line): its build dependencies are installed here,
# and it is built in the next step; one neither has stops with a `torchbuild-python:` line.
RUN mapfile -t apt_options < /opt/torchbuild/inputs/apt-options.txt \
 && mapfile -t apt_packages < /opt/torchbuild/inputs/apt-packages.txt \
 && mapfile -t pythons < /opt/torchbuild/inputs/pythons.txt \
 && mkdir -p /opt/torchbuild/record \
 && dpkg-query -W -f='${db:Status-Status} ${binary:Package}=${Version}\n' \
      | sed -n 's/^installed //p' | LC_ALL=C sort > /opt/torchbuild/record/dpkg-base.txt \
 && apt-get "${apt_options[@]}" update \
 && : > /opt/torchbuild/record/python-from-source.txt \
 && for v in "${pythons[@]}"; do \
      if [ -n "$(apt-cache "${apt_options[@]}" show --no-all-versions "python$v-venv" 2>/dev/null)" ]; then \
        apt_packages+=("python$v" "python$v-dev" "python$v-venv"); \
      elif grep -q "^$v " /opt/torchbuild/inputs/python-sources.txt; then \
        printf '%s\n' "$v" >> /opt/torchbuild/record/python-from-source.txt; \
        apt_packages+=(curl xz-utils gcc make libssl-dev zlib1g-dev libbz2-dev libffi-dev liblzma-dev \
                       libsqlite3-dev uuid-dev libreadline-dev libncurses-dev); \
      else \
        printf 'torchbuild-python: python%s is not in the base image'"'"'s apt archive and python_sources names no source for it\n' "$v"; \
        exit 1; \
      fi; \
    done \
 && if [ -f /opt/torchbuild/inputs/lock/apt.txt ]; then \
      mapfile -t apt_lock < /opt/torchbuild/inputs/lock/apt.txt \
      && { apt-get "${apt_options[@]}" install -y --no-install-recommends "${apt_lock[@]}" \
           || { printf 'torchbuild-lock: the locked %s packages did not install\n' apt; exit 1; }; }; \
    else \
      apt-get "${apt_options[@]}" install -y --no-install-recommends \
        ca-certificates git patch make pkg-config ccache cmake ninja-build "${apt_packages[@]}"; \
    fi \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# pip and requests use the system trust store, so site CAs apply to them too.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
# The same shell again: hadolint forgets SHELL after an ENV and would lint bash arrays as sh.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Each Python from source: the tarball python_sources names, refused unless its sha256 is the
# one given, built without shared libpython (as PyTorch's manylinux builders do) into
# /opt/python<v>, with python<v> on PATH for the venv step. No Python the archive has is touched.
# (DL3003: the source directory is made and removed in this one step; a WORKDIR would outlive it.)
# hadolint ignore=DL3003
RUN while read -r v; do \
      read -r _ url sha256 < <(grep "^$v " /opt/torchbuild/inputs/python-sources.txt) \
      && curl -fsSL --proto '=https,http' --retry 3 -o /tmp/python.tar -- "$url" \
      && { printf '%s  /tmp/python.tar\n' "$sha256" | sha256sum -c --quiet - \
           || { printf 'torchbuild-python: the source of python%s (%s) has another sha256 than python_sources gives\n' "$v" "$url"; exit 1; }; } \
      && mkdir /tmp/python && tar -xf /tmp/python.tar -C /tmp/python --strip-components=1 \
      && cd /tmp/python \
      && { ./configure --prefix="/opt/python$v" --with-ensurepip=install > /tmp/python-build.log 2>&1 \
           && make -j"$(nproc)" >> /tmp/python-build.log 2>&1 && make altinstall >> /tmp/python-build.log 2>&1 \
           || { tail -n 40 /tmp/python-build.log; printf 'torchbuild-python: python%s did not build from %s\n' "$v" "$url"; exit 1; }; } \
      && ln -s "/opt/python$v/bin/python$v" "/usr/local/bin/python$v" \
      && printf '%s %s %s\n' "$v" "$url" "$sha256" >> /opt/torchbuild/record/python-sources.txt \
      && cd / && rm -rf /tmp/python /tmp/python.tar /tmp/python-build.log \
      || exit 1; \
    done < /opt/torchbuild/record/python-from-source.txt

# cuda_version must be the CUDA of the image's nvcc (cuda-check.sh): checked here, not hours
# into a build. Empty for a CPU build. (Not CUDA_VERSION: nvidia/cuda bases set that ENV, which
# would win over an ARG of the same name.)
ARG TORCHBUILD_CUDA_VERSION=""
ARG TORCHBUILD_CUDA_HOME=/usr/local/cuda
COPY cuda-check.sh /opt/torchbuild/cuda-check.sh
RUN bash /opt/torchbuild/cuda-check.sh "${TORCHBUILD_CUDA_VERSION}" "${TORCHBUILD_CUDA_HOME}"

# The venvs: /opt/venv for python_version (`python3` in the image is the profile's Python) and
# /opt/venv-<v> for each other Python, each with the same requirements. Unlocked, pip is
# upgraded from a downloaded wheel whose sha256 is recorded, and the requirements' install
# writes pip's --report (the sha256 of every file it installed): `invoke image --lock` pins
# from these. Locked: `pip install --require-hashes --no-deps` of the lock's pins, pip included.
# (SC3054: hadolint forgets the SHELL above after the ARG and COPY of the CUDA check; it is bash.)
# hadolint ignore=SC2086,SC3054
RUN mapfile -t pythons < /opt/torchbuild/inputs/pythons.txt \
 && for v in "${pythons[@]}"; do \
      venv="/opt/venv-$v"; if [ "$v" = "${PYTHON_VERSION}" ]; then venv=/opt/venv; fi; \
      lock="/opt/torchbuild/inputs/lock/pip-$v.txt"; \
      "python$v" -m venv ${VENV_FLAGS} "$venv" || exit 1; \
      if [ -f /opt/torchbuild/inputs/lock/apt.txt ]; then \
        "$venv/bin/python" -m pip install --require-hashes --no-deps -r "$lock" \
        || { printf 'torchbuild-lock: the locked %s packages did not install\n' "pip (Python $v)"; exit 1; }; \
      else \
        "$venv/bin/python" -m pip download --no-deps --only-binary=:all: --dest /tmp/pip pip \
        && sha256sum /tmp/pip/pip-*.whl > "/opt/torchbuild/record/pip-$v.sha256" \
        && "$venv/bin/python" -m pip install --no-index /tmp/pip/pip-*.whl \
        && rm -rf /tmp/pip \
        && if [ -s /opt/torchbuild/inputs/requirements.txt ]; then \
             "$venv/bin/python" -m pip install --report "/opt/torchbuild/record/pip-$v.json" \
               -r /opt/torchbuild/inputs/requirements.txt; \
           fi || exit 1; \
      fi; \
    done
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}

# torchbuild itself, so `torchbuild build` runs inside the image (and the SIF). Locked, its
# dependencies come from the lock (--no-deps) and are checked to be all there. Last, the
# installed list (every dpkg and venv package, name and version) a build's manifest records.
COPY torchbuild-src /opt/torchbuild-src
RUN if [ -f /opt/torchbuild/inputs/lock/apt.txt ]; then \
      python -m pip install --no-deps /opt/torchbuild-src \
      && { python -m torchbuild.image.lock requires torchbuild \
           || { printf 'torchbuild-lock: the locked %s packages did not install\n' "torchbuild dependency"; exit 1; }; }; \
    else \
      python -m pip install --report /opt/torchbuild/record/torchbuild.json /opt/torchbuild-src; \
    fi \
 && torchbuild --version \
 && python -m torchbuild.image.lock installed > /opt/torchbuild/installed.txt

# The build's environment (HOME and ccache in the /cache bind...) is set by the backend that
# starts the container (torchbuild.runtime.environment), not here.
WORKDIR /src
CMD ["torchbuild", "--help"]
