# The torchbuild toolchain image on a dnf (RPM) base: toolchain.Dockerfile's stages and contract
# (the same inputs/ files, /opt/venv and /opt/venv-<v>, records under /opt/torchbuild/record,
# torchbuild installed last) for RHEL 8-class floors (glibc 2.28): rockylinux:8, almalinux:8 and
# PyTorch's manylinux_2_28 builder (quay.io/pypa/manylinux_2_28_x86_64, AlmaLinux 8).
# image.recipe_for chooses it by the base's name (glibc.base_family). Not built on torchbuild's
# test machines (no registry there): rendered, linted by hadolint and translated for Apptainer.
# Every ARG is filled from the resolved profile by `invoke image`; do not edit values here.
#
# What the manylinux_2_28 builder provides (pypa/manylinux build.sh and README): AlmaLinux 8 with
# PowerTools enabled, gcc-toolset-N (GCC 13, later 14, depending on the image's date) under
# /opt/rh/gcc-toolset-N/root with its usr/bin first on PATH, and CPythons under
# /opt/python/cpXY-cpXY/bin (static libpython). Its `gcc` is the toolset's; this recipe uses it and
# its Pythons as they are.
ARG BASE_IMAGE=quay.io/pypa/manylinux_2_28_x86_64
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION=3.12
# "--system-site-packages" or empty.
ARG VENV_FLAGS=""

ENV LANG=C.UTF-8 \
    LC_ALL=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Site CA certificates from the profile's ca_certificates (often none): copied into
# /etc/pki/ca-trust/source/anchors/ by the next step (the directory also holds a README).
COPY certs/ /opt/torchbuild/certs/

# The profile's lists, as toolchain.Dockerfile reads them: apt-packages.txt holds the RPM names
# here (image.rpm_packages: compiler, BLAS, MPI, CUDA, comms), requirements.txt, pythons.txt,
# python-sources.txt; apt-options.txt is always empty on a dnf base (--apt-option is refused).
COPY inputs/ /opt/torchbuild/inputs/

# dnf. EPEL for ccache (EL8 and EL9: ccache is in EPEL only) and blis-devel; PowerTools (EL8,
# `crb enable` from epel-release) or CRB (EL9) for ninja-build and the -devel packages AppStream
# lacks (openblas-devel on EL8 is in PowerTools). Fedora has all of them in its own repositories.
# The fixed tools, then for each Python: the builder's /opt/python/cpXY-cpXY (nothing installed),
# else dnf's python3.X with -devel (python39 on EL8), else python-sources.txt as in
# toolchain.Dockerfile. record/rpm-base.txt: the base's RPMs (name=version-release), as
# dpkg-base.txt is on apt. A lock is refused: `invoke image --lock` pins dpkg packages only.
RUN mapfile -t rpm_packages < /opt/torchbuild/inputs/apt-packages.txt \
 && mapfile -t pythons < /opt/torchbuild/inputs/pythons.txt \
 && mkdir -p /opt/torchbuild/record \
 && if [ -f /opt/torchbuild/inputs/lock/apt.txt ]; then \
      printf 'torchbuild-lock: the locked %s packages did not install (locks are made for apt bases only)\n' dnf; \
      exit 1; \
    fi \
 && rpm -qa --qf '%{NAME}=%{VERSION}-%{RELEASE}\n' | LC_ALL=C sort > /opt/torchbuild/record/rpm-base.txt \
 && if [ ! -f /etc/fedora-release ]; then \
      dnf install -y --setopt=install_weak_deps=False dnf-plugins-core epel-release \
      && if command -v crb > /dev/null; then crb enable; \
         else dnf config-manager --set-enabled powertools 2> /dev/null || dnf config-manager --set-enabled crb; fi; \
    fi \
 && : > /opt/torchbuild/record/python-from-source.txt \
 && : > /opt/torchbuild/record/python-from-builder.txt \
 && for v in "${pythons[@]}"; do \
      cp="cp${v//./}"; found=""; \
      if [ -x "/opt/python/$cp-$cp/bin/python$v" ]; then \
        ln -sf "/opt/python/$cp-$cp/bin/python$v" "/usr/local/bin/python$v"; \
        printf '%s /opt/python/%s-%s\n' "$v" "$cp" "$cp" >> /opt/torchbuild/record/python-from-builder.txt; \
        continue; \
      fi; \
      for name in "python$v" "python${v//./}"; do \
        if dnf -q info "$name-devel" > /dev/null 2>&1; then \
          rpm_packages+=("$name" "$name-devel"); found=1; break; \
        fi; \
      done; \
      if [ -n "$found" ]; then continue; fi; \
      if grep -q "^$v " /opt/torchbuild/inputs/python-sources.txt; then \
        printf '%s\n' "$v" >> /opt/torchbuild/record/python-from-source.txt; \
        rpm_packages+=(curl xz tar gcc make openssl-devel zlib-devel bzip2-devel libffi-devel xz-devel \
                       sqlite-devel libuuid-devel readline-devel ncurses-devel); \
      else \
        printf 'torchbuild-python: python%s is neither in /opt/python nor in the base image'"'"'s dnf repositories, and python_sources names no source for it\n' "$v"; \
        exit 1; \
      fi; \
    done \
 && dnf install -y --setopt=install_weak_deps=False \
      ca-certificates git patch make pkgconf-pkg-config ccache cmake ninja-build which findutils "${rpm_packages[@]}" \
 && find /opt/torchbuild/certs -name '*.crt' -exec cp -t /etc/pki/ca-trust/source/anchors/ {} + \
 && update-ca-trust \
 && for root in /opt/rh/gcc-toolset-*; do \
      bin="$root/root/usr/bin"; n="$(basename "$root")"; n="${n/gcc-toolset-/}"; \
      for tool in gcc g++; do \
        if [ -x "$bin/$tool" ] && [ ! -e "/usr/local/bin/$tool-$n" ]; then ln -s "$bin/$tool" "/usr/local/bin/$tool-$n"; fi; \
      done; \
    done \
 && for bin in /usr/lib64/openmpi/bin /usr/lib64/mpich/bin; do \
      for tool in mpicc mpicxx mpiexec mpirun; do \
        if [ -x "$bin/$tool" ] && [ ! -e "/usr/local/bin/$tool" ]; then ln -s "$bin/$tool" "/usr/local/bin/$tool"; fi; \
      done; \
    done \
 && dnf clean all \
 && rm -rf /var/cache/dnf
# The gcc-toolset links (gcc-13, g++-13: the CC and CXX a compiler_version names) and the MPI
# links (EL puts MPI under /usr/lib64/<mpi>/bin, off PATH) are made above for what is installed.
# pip and requests use the system trust store, so site CAs apply to them too.
ENV PIP_CERT=/etc/pki/tls/certs/ca-bundle.crt \
    REQUESTS_CA_BUNDLE=/etc/pki/tls/certs/ca-bundle.crt \
    SSL_CERT_FILE=/etc/pki/tls/certs/ca-bundle.crt
# The same shell again: hadolint forgets SHELL after an ENV and would lint bash arrays as sh.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Each Python from source, as in toolchain.Dockerfile (only for a Python neither /opt/python nor
# dnf has; the manylinux builder has every CPython PyTorch supports).
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
# into a build. Empty for a CPU build.
ARG TORCHBUILD_CUDA_VERSION=""
ARG TORCHBUILD_CUDA_HOME=/usr/local/cuda
COPY cuda-check.sh /opt/torchbuild/cuda-check.sh
RUN bash /opt/torchbuild/cuda-check.sh "${TORCHBUILD_CUDA_VERSION}" "${TORCHBUILD_CUDA_HOME}"

# The venvs, as in toolchain.Dockerfile: /opt/venv for python_version and /opt/venv-<v> for each
# other Python, pip upgraded from a downloaded wheel whose sha256 is recorded, pip's --report of
# the requirements. (The locked branch is toolchain.Dockerfile's; the first step refuses a lock.)
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

# torchbuild itself, last, as in toolchain.Dockerfile. installed.txt lists the venvs' packages
# (torchbuild.image.lock reads dpkg, which an RPM base lacks); the RPMs are listed beside it in
# record/rpm-installed.txt.
COPY torchbuild-src /opt/torchbuild-src
RUN python -m pip install --report /opt/torchbuild/record/torchbuild.json /opt/torchbuild-src \
 && torchbuild --version \
 && python -m torchbuild.image.lock installed > /opt/torchbuild/installed.txt \
 && rpm -qa --qf '%{NAME}=%{VERSION}-%{RELEASE}\n' | LC_ALL=C sort > /opt/torchbuild/record/rpm-installed.txt

# The build's environment (HOME and ccache in the /cache bind...) is set by the backend that
# starts the container (torchbuild.runtime.environment), not here.
WORKDIR /src
CMD ["torchbuild", "--help"]
