"""A verdict judge as the RLAIF recipe's AI-feedback reward, in the training process and batched:
every completion of a step is asked the teacher's verdict question ("Is the candidate solution
correct? ... Yes or No", `mlxio.rl.verifier.verdict_prompt`) in a few padded forward passes of
the judge (`recipes.rlaif_judge`'s base + LoRA adapter, or its base alone: the untrained judge),
and scored P(yes) + P(neither) / 2 in [0, 1] (`mlxcore.rl.verdict.verdict_scores`, the served
judge's score / 10). No test runs: the judge reads the prompt and the completion only.

One batched pass per step replaces one HTTP or local call per completion: a local judge reads
its prompt in 16-token chunks, so a 400-token verdict prompt costs 25 forward passes there.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mlxcore.rl.tasks import Problem
from mlxio.errors import ConfigError

UNTRAINED = "untrained"
# the judge recipe's own LoRA shape (recipes.rlaif_judge_config): what "untrained" switches off
_BASE_LORA = {"rank": 8, "scale": 2.0, "keys": ["self_attn.q_proj"], "num_layers": 8}


def adapter_digest(adapters: str) -> str:
    """sha256 of the adapter weights (part of the reward's cache key), or "untrained"."""
    if adapters == UNTRAINED:
        return UNTRAINED
    return hashlib.sha256((Path(adapters) / "adapters.safetensors").read_bytes()).hexdigest()[:16]


def adapter_config(adapters: str) -> dict:
    """{rank, scale, keys, num_layers} of an mlx-lm adapter folder (ConfigError names what is off)."""
    if adapters == UNTRAINED:
        return dict(_BASE_LORA)
    path = Path(adapters) / "adapter_config.json"
    try:
        cfg = json.loads(path.read_text())
        lp = cfg["lora_parameters"]
        return {"rank": int(lp["rank"]), "scale": float(lp["scale"]), "keys": list(lp["keys"]),
                "num_layers": int(cfg["num_layers"])}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"teacher.judge: {path} is not a judge's adapter_config.json ({err})",
                          fix="point it at recipes.rlaif_judge's out_dir/adapters, or say 'untrained'") from None


class VerdictJudgeReward:
    """The `ai_feedback` reward (the `mlxio.rl.rewards` protocol) from a verdict judge run here.

    `adapters`: recipes.rlaif_judge's adapters/ folder, or "untrained" (the judge's base, the
    embedded SmolLM2 or `model`, with LoRA off). Loaded on first use; `batch` verdict prompts per
    forward pass (rows of similar length together); prompts over `max_tokens` are missing (None),
    never scored."""

    name = "ai_feedback"

    def __init__(self, adapters: str, model: str | None = None, batch: int = 16, max_tokens: int = 768) -> None:
        self.adapters, self.model_path, self.batch, self.max_tokens = adapters, model, batch, max_tokens
        self._lora = adapter_config(adapters)  # a bad folder fails here, before any rollout
        self._digest = adapter_digest(adapters)
        self._loaded = None
        self._lock = threading.Lock()

    def config_key(self) -> str:
        return f"verdict-batch-v1|{self.model_path}|{self._digest}|max={self.max_tokens}"

    def _load(self):
        """(tokenizer, answers, trunk, last_logits, LoRA tree) of the judge, loaded once."""
        with self._lock:
            if self._loaded is None:
                self._loaded = _load_judge(self.adapters, self.model_path, self._lora)
            return self._loaded

    def scores(self, problems: Sequence[Problem], completions: Sequence[str]) -> np.ndarray:
        """[N] verdict scores in [0, 1] (NaN for prompts over `max_tokens`)."""
        import mlx.core as mx

        from mlxcore.rl import verdict
        from mlxio.rl import verifier

        tokenizer, answers, trunk, logits_fn, params = self._load()
        rows = [verifier.verdict_prompt(tokenizer, p.prompt, c) for p, c in zip(problems, completions, strict=True)]
        out = np.full(len(rows), np.nan)
        keep = [i for i, r in enumerate(rows) if len(r) <= self.max_tokens]
        order = sorted(keep, key=lambda i: len(rows[i]))
        for s in range(0, len(order), self.batch):
            chunk = order[s:s + self.batch]
            width = verifier.padded_width(max(len(rows[i]) for i in chunk))
            ids = np.zeros((len(chunk), width), np.int32)
            for j, i in enumerate(chunk):
                ids[j, :len(rows[i])] = rows[i]
            last = mx.array([len(rows[i]) - 1 for i in chunk])
            y, n = verdict.answer_probs(logits_fn(params, trunk(mx.array(ids)), last), answers.yes_all, answers.no_all)
            mx.eval(y, n)
            out[chunk] = verdict.verdict_scores(np.array(y), np.array(n))
        return out

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float | None]:
        return [None if np.isnan(s) else float(s) for s in self.scores(problems, completions)]


def _load_judge(adapters: str, model: str | None, lora_cfg: dict):
    import mlx.core as mx
    from mlx.utils import tree_unflatten

    from mlxcore.rl import policy as pg
    from mlxcore.train.lora import LoraConfig
    from mlxio.rl import grpo, verifier
    from mlxio.weights import llm_lora

    targets = tuple(sorted({k.rsplit(".", 1)[-1] for k in lora_cfg["keys"]}))
    lora = LoraConfig(rank=lora_cfg["rank"], alpha=lora_cfg["scale"] * lora_cfg["rank"], targets=targets)
    policy = grpo.load_model(model, lora, lora_cfg["num_layers"], seed=0, dequantize=True)
    params = llm_lora.lora_tree(policy.model)
    if adapters == UNTRAINED:
        params = pg.reference_params(params)  # every lora_b zero: the base model
    else:
        saved = mx.load(str(Path(adapters) / "adapters.safetensors"))
        have = {k for k, _ in _flat(params)}
        if set(saved) != have:
            raise ConfigError(f"teacher.judge: {adapters} holds {len(saved)} adapter arrays, the judge's LoRA "
                              f"{len(have)} ({sorted(set(saved) ^ have)[:3]} differ)")
        params = tree_unflatten(list(saved.items()))
    cut = len(policy.model.layers) - lora_cfg["num_layers"]
    answers = verifier.answer_ids(policy.tokenizer, str(policy.source or model))
    return policy.tokenizer, answers, llm_lora.trunk(policy.model, cut), llm_lora.last_logits(policy.model, cut), params


def _flat(tree):
    from mlx.utils import tree_flatten

    return tree_flatten(tree)
