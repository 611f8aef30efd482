"""Pure computation, no I/O: functions of parameter pytrees (nested dicts/lists of `mx.array`) -
encoders (`bert`, `t5`, `encoder`), LoRA, losses, ranking and retrieval scores, the policy
gradient and log-probs, optimizer transforms, the compiled step, the static decode step
(`decode_step`, `decode_fused`), quantisation - and plain-Python pieces of the same kind: the
shape buckets compiled steps see (`buckets`), rollouts packed into rows (`packing`), the
procedural coding tasks (`tasks`, `task_families`), pass@k and verdict scores, content hashing.

Nothing here reads a file, the network, a clock or a process (tests/test_purity.py keeps I/O
imports out; docs/architecture.md says which layer owns what). The only state is a registry
of compiled CUDA helpers that a program fills at start-up (`cuda_jit`, `ffn_cuda`:
`mlxio.runtime.setup()`, which also picks MLX's CPU BLAS, so a program calls it before it
imports this package).
"""
