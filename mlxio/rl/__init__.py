"""The RLAIF loop's parts that touch models, processes, devices or files: coding problems read from
files and code extraction (`problems`), rollouts (`rollout`; the static decode engine's host
loop `decode`), rewards and their cache, the sandboxed code judge (`judge`), AI-feedback
teachers over HTTP or in-process (`teacher`, `local_teacher`), held-out evaluation and the
problems' options (`evaluation`), the update's batch and policy loading (`grpo`), memory-driven
batching (`auto_batch`), rollout logs and the verdict judge's data (`rollout_log`, `verifier`,
`mutants`), and the worker's wire (`worker`, `worker_protocol`). The pure pieces they use - the
procedural tasks, packing, the decode step, shape buckets, the policy loss - are in mlxcore.
"""
