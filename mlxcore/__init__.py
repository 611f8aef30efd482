"""Pure computation, no I/O: functions of parameter pytrees (nested dicts/lists of `mx.array`)
and plain-Python pieces of the same kind, in wings by job:

- `models/`: the encoders (BERT, T5, their norms, config shapes) and the static decode step;
- `retrieval/`: the multi-vector encoder, late-interaction scores and losses, the training
  objective, ranking;
- `rl/`: the policy gradient, log-probs, the verdict judge's pieces, pass@k, packing, tasks;
- `train/`: tree helpers, LoRA, optimizers, the compiled step, GradCache, precision,
  quantisation, recomputation, shape buckets;
- `kernels/`: our CUDA kernels;
- beside them: content hashing (`digest`) and range declarations for config fields (`fields`).

Nothing here reads a file, the network, a clock or a process (tests/test_purity.py keeps I/O
imports out; docs/architecture.md says which layer owns what). The only state is a registry
of compiled CUDA helpers that a program fills at start-up (`kernels.cuda_jit`, `kernels.ffn_cuda`:
`mlxio.runtime.setup()`, which also picks MLX's CPU BLAS, so a program calls it before it
imports this package).
"""
