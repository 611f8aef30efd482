"""Everything that meets the world outside the process - files, caches, the network, child
processes, devices, clocks - and the code that holds a loaded model, tokenizer or device while
it works (mlxcore holds the pure computation):

- `weights/`: weights in and out (safetensors, GGUF, encoders, causal LMs with LoRA, exports);
- `data/`: the retriever's pairs, token cache and splits, read from sources, PyPI and JSONL;
- `search/`: embedding texts with a trained encoder, the on-disk multi-vector index;
- `rl/`: the RLAIF loop's parts that load, sample, judge or log (rollouts, rewards, the code
  judge and teacher, evaluation, the update's batch, the worker's wire);
- `sandbox/`: untrusted code run in isolated processes;
- `run/`: a run's scaffolding (config files and flags, checkpoints, the loop's cadence, logs,
  ranks, memory);
- `gpu/`: MLX's compiled GPU kernels (cache, export / import, warm-up), NVRTC for ours, the
  fused feed-forward's C++ extension;
- beside them: the process's set-up (`runtime.setup()`, which every entry point calls first:
  importing this package changes nothing), MLX's CPU BLAS (`blas`), writes that never leave a
  half file or follow a link (`atomic`), bounded input reading (`inputs`) and JSONL lines read
  defensively (`lines`), JSON-RPC framing
  (`rpc`), thread-safe `ast.parse` (`pyparse`), credentials masked (`redact`), the error types
  (`errors`).
"""
