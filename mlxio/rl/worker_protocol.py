"""The worker's protocol: its version and the JSON Schema of every method's params and result
(`SCHEMAS[method]["params" | "result"]`), which `initialize` reports, docs/worker-protocol.md
describes and `mlxio.rl.worker` checks requests against.
"""

from __future__ import annotations

PROTOCOL_VERSION = "1.0"
# sequences one `generate` may ask for (len(prompts) x n); a memory estimate bounds it further
MAX_GENERATE_ROWS = 4096

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_TOKEN_ROWS = {"type": "array", "minItems": 1, "description": "N sequences of token ids",
               "items": {"type": "array", "minItems": 2, "items": {"type": "integer", "minimum": 0}}}
_LOGP_ROWS = {"type": "array", "description": "N rows; row i has len(tokens[i]) - 1 entries: "
              "entry t is log p(tokens[i][t + 1] | tokens[i][:t + 1])",
              "items": {"type": "array", "items": _NUM}}
_DIR = {"type": "string", "description": "run directory (default: the config's `out_dir`)"}
_OBJ = {"type": "object"}

SCHEMAS: dict[str, dict[str, dict]] = {
    "initialize": {
        "params": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "preset": {"type": "string", "description": "base config: a preset of "
                           "the RLAIF recipe's config (quick, full, smoke); default quick"},
                "config": {"type": "object", "description": "overrides of the recipe's Config, "
                           "nested as in a run's config.json (e.g. {\"optim\": {\"lr\": 1e-5}}); "
                           "unknown keys are errors"},
                "protocol_version": {"type": "string", "description": "the client's; its major "
                                     "version must equal the worker's"},
            },
        },
        "result": {
            "type": "object", "required": ["protocol_version", "versions", "capabilities",
                                           "config", "model", "step"],
            "properties": {
                "protocol_version": {"type": "string"},
                "versions": {"type": "object", "properties": {
                    "worker": {"type": "string"}, "mlx": {"type": "string"},
                    "mlx_lm": {"type": "string"}, "python": {"type": "string"}}},
                "capabilities": {"type": "object", "properties": {
                    "roles": {"type": "array", "items": {"type": "string"}},
                    "methods": {"type": "array", "items": {"type": "string"}},
                    "max_line_bytes": _INT, "vocab_size": _INT,
                    "eos_token_ids": {"type": "array", "items": _INT}, "pad_id": _INT,
                    "accumulation": {"type": "integer", "description": "train_step's N must "
                                     "be a multiple of it"},
                    "inner_epochs": _INT}},
                "config": {"type": "object", "description": "the full resolved Config"},
                "model": {"type": "string"},
                "step": _INT,
            },
        },
    },
    "generate": {
        "params": {
            "type": "object", "additionalProperties": False, "required": ["prompts"],
            "properties": {
                "prompts": {"type": "array", "minItems": 1, "maxItems": MAX_GENERATE_ROWS,
                            "items": {"type": "string"}},
                "n": {"type": "integer", "minimum": 1, "maximum": MAX_GENERATE_ROWS,
                      "description": "completions per prompt (default: config group_size); "
                                     f"len(prompts) x n <= {MAX_GENERATE_ROWS}"},
                "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1 << 20,
                               "description": "default: config max_new_tokens; at most the "
                                              "model's max_position_embeddings"},
                "temperature": {"type": "number", "minimum": 0, "maximum": 100, "description": "0 = greedy"},
                "top_p": {"type": "number", "minimum": 0, "maximum": 1},
                "stop": {"type": "array", "maxItems": 64, "items": {"type": "string"}, "description": "stop "
                         "strings (text cut before them; the completing token kept)"},
                "stop_at_code_end": {"type": "boolean", "description": "end at the close of "
                                     "the first ``` block (default: config)"},
                "chat_template": {"type": "boolean", "description": "prompt as a user turn "
                                  "of the chat template (default true)"},
                "seed": {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1,
                         "description": "default: the recipe's seed of the current step"},
            },
        },
        "result": {
            "type": "object", "required": ["texts", "prompt_tokens", "completion_tokens",
                                           "logprobs", "prompt_index", "finished"],
            "properties": {
                "texts": {"type": "array", "items": {"type": "string"},
                          "description": "N = len(prompts) * n, prompt-major"},
                "prompt_tokens": {"type": "array", "items": {"type": "array", "items": _INT},
                                  "description": "one row per prompt (template applied)"},
                "completion_tokens": {"type": "array", "items": {"type": "array", "items": _INT}},
                "logprobs": {"type": "array", "items": {"type": "array", "items": _NUM},
                             "description": "per completion token, at temperature 1"},
                "prompt_index": {"type": "array", "items": _INT},
                "finished": {"type": "array", "items": {"type": "boolean"}},
                "tokens_per_s": _NUM,
                "seconds": {"type": "number", "description": "the worker's time in generation "
                            "(tokenising, sampling, decoding)"},
            },
        },
    },
    "train_step": {
        "params": {
            "type": "object", "additionalProperties": False,
            "required": ["tokens", "completion_mask", "advantages"],
            "properties": {
                "tokens": _TOKEN_ROWS,
                "completion_mask": {"type": "array", "description": "N rows as long as tokens: "
                                    "1 where the token is a trained completion token, else 0",
                                    "items": {"type": "array", "items": {
                                        "type": "number", "minimum": 0, "maximum": 1}}},
                "advantages": {"type": "array", "items": _NUM, "description": "N"},
                "ref_logprobs": {**_LOGP_ROWS, "description": "optional KL reference; default: "
                                 "the LoRA-off policy (as the recipe). " + _LOGP_ROWS["description"]},
                "old_logprobs": {**_LOGP_ROWS, "description": "optional, for clip_eps; default: "
                                 "the current policy. " + _LOGP_ROWS["description"]},
            },
        },
        "result": {
            "type": "object", "required": ["step", "loss", "pg_loss", "kl", "grad_norm"],
            "properties": {
                "step": {"type": "integer", "description": "train_steps done (after this one)"},
                "loss": _NUM, "pg_loss": _NUM, "kl": _NUM, "grad_norm": _NUM, "entropy": _NUM,
                "clip_frac": _NUM, "lr": _NUM,
                "skipped": {"type": "integer", "description": "1: non-finite loss or gradient, "
                            "update skipped (weights unchanged)"},
                "consecutive_skips": _INT, "tokens": _INT,
                "seconds": {"type": "number", "description": "the worker's time in the batch's "
                            "log-probs and the update(s), without parsing and packing"},
            },
        },
    },
    "eval_logprobs": {
        "params": {
            "type": "object", "additionalProperties": False, "required": ["tokens"],
            "properties": {"tokens": _TOKEN_ROWS,
                           "reference": {"type": "boolean", "description": "under the LoRA-off "
                                         "reference instead of the policy (default false)"}},
        },
        "result": {"type": "object", "required": ["logprobs"], "properties": {"logprobs": _LOGP_ROWS}},
    },
    "save": {
        "params": {
            "type": "object", "additionalProperties": False,
            "properties": {"dir": _DIR,
                           "meta": {"type": "object", "description": "the client's own state, "
                                    "saved atomically with the weights; load returns it"},
                           "adapters": {"type": "boolean", "description": "also write mlx-lm "
                                        "adapters to <dir>/adapters (default false)"}},
        },
        "result": {"type": "object", "required": ["step", "path"],
                   "properties": {"step": _INT, "path": {"type": "string"}}},
    },
    "load": {
        "params": {
            "type": "object", "additionalProperties": False,
            "properties": {"dir": _DIR,
                           "step": {"type": "integer", "minimum": 0, "description": "that step's "
                                    "checkpoint (default: the newest that verifies)"}},
        },
        "result": {"type": "object", "required": ["step", "path", "meta"],
                   "properties": {"step": _INT, "path": {"type": "string"},
                                  "meta": {"type": ["object", "null"],
                                           "description": "what save's meta held"}}},
    },
    "shutdown": {
        "params": {"type": "object", "additionalProperties": False, "properties": {}},
        "result": {"type": "object", "required": ["step"], "properties": {"step": _INT}},
    },
}
