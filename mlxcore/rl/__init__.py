"""RLAIF's computation: the policy-gradient loss and advantages (`policy`), chunked log-probs
(`logprobs`), the verdict judge's loss and AUC (`verdict`), pass@k (`passk`), rollouts packed into
rows (`packing`), and the procedural coding tasks (`tasks`, `task_families/`)."""
