"""A verdict judge's data and scores: judged completions as the teacher's verdict prompt
(`mlxio.rl.teacher.rubric_messages(..., "verdict")`, tokenised as `mlx_lm.server` tokenises a
chat request), training batches of them, P(yes) under a LoRA tree, AUC per evaluation set, and
rollouts sampled and judged in the sandbox for a user who has no logs yet (`SampleConfig`: the
recipe's `sample.*`). The recipe that
trains the judge is `recipes.rlaif_judge`; the pure pieces are `mlxcore.rl.verdict`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np

from mlxcore.digest import hashed_int
from mlxcore.fields import MAX_SEED, bounded
from mlxcore.rl import tasks, verdict
from mlxcore.rl.tasks import Problem
from mlxio.errors import ConfigError
from mlxio.rl import rollout_log
from mlxio.rl.execution import CodeJudge
from mlxio.rl.teacher import MIN_ANSWER_MASS, rubric_messages

ANSWERS = ("Yes", "No")  # the one-token answers the judge is taught (what the chat turn starts with)


@attrs.frozen(kw_only=True)
class Answers:
    """Token ids of the answers: `yes` / `no` are the trained targets; `yes_all` / `no_all`
    every token that reads as that answer ("Yes", " yes", ...), summed when scoring."""

    yes: int
    no: int
    yes_all: mx.array
    no_all: mx.array


def answer_ids(tokenizer, where: str = "model") -> Answers:
    """The tokenizer's answer tokens; ConfigError when "Yes" or "No" is not one token (a served
    verdict judge reads its first answer token only)."""
    from mlxio.rl.local_teacher import answer_token_ids

    ids = [tokenizer.encode(word, add_special_tokens=False) for word in ANSWERS]
    for word, got in zip(ANSWERS, ids, strict=True):
        if len(got) != 1:
            raise ConfigError(f"the tokenizer spells {word!r} in {len(got)} tokens; a verdict judge answers in one",
                              where=where, fix="pick a model whose vocabulary has 'Yes' and 'No' tokens (--model)")
    every = answer_token_ids(tokenizer)
    return Answers(yes=ids[0][0], no=ids[1][0], yes_all=mx.array(every["yes"] or ids[0]),
                   no_all=mx.array(every["no"] or ids[1]))


@attrs.frozen(kw_only=True)
class Encoded:
    """Judged completions (`items`) as verdict prompts: rows (token lists), labels [N] bool
    (passed), groups [N] (task ids: a problem's completions are resampled together), how many
    were left out as longer than the limit, and (`with_states`) each row's hidden states
    [T_i, H] at the input of the first LoRA block."""

    items: list[rollout_log.Judged]
    rows: list[list[int]]
    labels: np.ndarray
    groups: np.ndarray
    too_long: int = 0
    states: list[mx.array] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def counts(self) -> dict:
        return {"n": len(self), "n_pass": int(self.labels.sum()), "n_fail": int((~self.labels).sum()),
                "problems": len(set(self.groups.tolist())), "too_long": self.too_long}


def verdict_prompt(tokenizer, prompt: str, completion: str) -> list[int]:
    """Token ids of the verdict question about `completion`, the assistant turn opened (what
    `mlx_lm.server` feeds the model for `HttpJudge(scoring="verdict")`)."""
    return list(tokenizer.apply_chat_template(rubric_messages(prompt, completion, "verdict"),
                                              add_generation_prompt=True))


def encode(tokenizer, judged: Sequence[rollout_log.Judged], max_tokens: int) -> Encoded:
    """`judged` as verdict prompts, those over `max_tokens` left out (counted)."""
    kept, rows = [], []
    for j in judged:
        ids = verdict_prompt(tokenizer, j.prompt, j.completion)
        if len(ids) <= max_tokens:
            kept.append(j)
            rows.append(ids)
    return Encoded(items=kept, rows=rows, labels=np.array([j.passed for j in kept], bool),
                   groups=np.array([j.task_id for j in kept], object), too_long=len(judged) - len(rows))


def padded_width(length: int) -> int:
    """Rows are right-padded to a multiple of 32 tokens (a few compiled shapes, little waste)."""
    return -(-length // 32) * 32


def by_length(data: Encoded, batch: int) -> list[np.ndarray]:
    """Row indices in chunks of `batch`, rows of similar length together (less padding)."""
    order = np.argsort([len(r) for r in data.rows], kind="stable")
    return [order[s:s + batch] for s in range(0, len(order), batch)]


def with_states(data: Encoded, trunk: Callable[[mx.array], mx.array], batch: int) -> Encoded:
    """`data` with each row's hidden states from `trunk` (`mlxio.weights.llm_lora.trunk`:
    the frozen blocks before the first LoRA block), computed once, `batch` rows at a time."""
    from mlxio.run.reporting import progress

    states: list[mx.array | None] = [None] * len(data)
    for chunk in progress(by_length(data, batch), desc="frozen blocks", unit="batch", every_s=60.0):
        width = padded_width(max(len(data.rows[i]) for i in chunk))
        ids = np.zeros((len(chunk), width), np.int32)
        for j, i in enumerate(chunk):
            ids[j, :len(data.rows[i])] = data.rows[i]
        hidden = trunk(mx.array(ids))
        mx.eval(hidden)
        for j, i in enumerate(chunk):
            states[i] = hidden[j, :len(data.rows[i])]
    mx.eval(states)
    return attrs.evolve(data, states=states)


def batch_arrays(data: Encoded, idx: Sequence[int], answers: Answers) -> dict:
    """Rows `idx` of `data` (with states) as arrays: inputs [B, W, H] (states, right-padded with
    zeros to `padded_width`), last [B] (each row's last position), target [B] (the answer token
    its label asks for), other [B]."""
    idx = np.asarray(idx)
    width = padded_width(max(len(data.rows[i]) for i in idx))
    inputs = mx.stack([mx.pad(data.states[i], [(0, width - data.states[i].shape[0]), (0, 0)]) for i in idx])
    labels = data.labels[idx]
    return {"inputs": inputs, "last": mx.array([len(data.rows[i]) - 1 for i in idx]),
            "target": mx.array(np.where(labels, answers.yes, answers.no).astype(np.int32)),
            "other": mx.array(np.where(labels, answers.no, answers.yes).astype(np.int32))}


def train_batch(data: Encoded, step: int, per_step: int, accum: int, answers: Answers, seed: int) -> dict:
    """Step `step`'s balanced batch (`mlxcore.rl.verdict.balanced_indices`: per_step / 2 passing,
    per_step / 2 failing), leaves [accum, per_step / accum, ...], both classes alike in every
    micro-batch."""
    pos, neg = np.flatnonzero(data.labels), np.flatnonzero(~data.labels)
    idx = np.concatenate([pos, neg])[verdict.balanced_indices(step, per_step // 2, len(pos), len(neg), seed)]
    idx = idx.reshape(2, accum, -1).transpose(1, 0, 2).reshape(-1)  # micro-batch k: its share of each class
    arrays = batch_arrays(data, idx, answers)
    return {k: v.reshape(accum, per_step // accum, *v.shape[1:]) for k, v in arrays.items()}


def answer_probs(last_logits: Callable, params, data: Encoded, answers: Answers, batch: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(P(yes) [N], P(no) [N]) of every row of `data` (with states) under `params`, `batch`
    rows at a time."""
    p_yes, p_no = np.zeros(len(data)), np.zeros(len(data))
    for chunk in by_length(data, batch):
        arrays = batch_arrays(data, chunk, answers)
        y, n = verdict.answer_probs(last_logits(params, arrays["inputs"], arrays["last"]),
                                    answers.yes_all, answers.no_all)
        mx.eval(y, n)
        p_yes[chunk], p_no[chunk] = np.array(y), np.array(n)
    return p_yes, p_no


def _ci(samples: np.ndarray) -> list[float] | None:
    """The 95% interval of bootstrap samples as a JSON list (None if every resample had one class)."""
    found = verdict.interval(samples)
    return None if found is None else list(found)


def _judge_summary(p_yes: np.ndarray, p_no: np.ndarray, labels: np.ndarray, boot: np.ndarray) -> dict:
    scores = verdict.verdict_scores(p_yes, p_no)
    return {"auc": verdict.roc_auc(scores, labels), "ci95": _ci(boot),
            "accuracy_at_0.5": float(((scores >= 0.5) == labels).mean()),
            "mean_score_pass": float(scores[labels].mean()) if labels.any() else None,
            "mean_score_fail": float(scores[~labels].mean()) if (~labels).any() else None,
            "answered": float((p_yes + p_no >= MIN_ANSWER_MASS).mean())}


def auc_report(probs: dict[str, tuple[np.ndarray, np.ndarray]], data: Encoded, resamples: int,
               seed: int = 0) -> dict:
    """Per judge (name -> (P(yes), P(no))) on one evaluation set: ROC AUC of the verdict score
    for pass vs fail with a 95% bootstrap interval over problems, accuracy at 0.5, mean score
    per label, the share of rows it answered (P(yes) + P(no) >= 0.5); with "untrained" and
    "trained" also their paired AUC difference."""
    out = data.counts()
    if not len(data) or data.labels.all() or not data.labels.any():
        return {**out, "note": "needs passing and failing completions for an AUC"}
    scores = {name: verdict.verdict_scores(*p) for name, p in probs.items()}
    boot = verdict.auc_bootstrap(scores, data.labels, data.groups, resamples=resamples, seed=seed)
    for name, (p_yes, p_no) in probs.items():
        out[name] = _judge_summary(p_yes, p_no, data.labels, boot[name])
    if {"untrained", "trained"} <= probs.keys():
        out["diff"] = {"auc": out["trained"]["auc"] - out["untrained"]["auc"],
                       "ci95": _ci(boot["trained"] - boot["untrained"])}
    return out


# ---------------------------------------------------------------- rollouts of its own

@attrs.frozen(kw_only=True)
class SampleConfig:
    """Rollouts the verdict-judge recipe samples and judges itself (a fresh user has no logs): G
    completions per procedural problem from `policy`, judged in the sandbox by the rewards' own
    judge (`sampling_problems`, `sample_rollouts`; the recipe's `sample.*`)."""

    policy: str | None = None  # None: the judge's own base model; or a model dir / GGUF / hub id (an RLAIF run's fused/)
    families: tuple[str, ...] = ("strings", "lists", "arithmetic", "dicts")
    difficulty: tuple[int, ...] = bounded((1,), ge=min(tasks.LEVELS), le=max(tasks.LEVELS))  # levels 1-3 (level 1: within the embedded model's reach, dev/results/cpu/task_difficulty.json)
    train_per_template: int = bounded(8, ge=0, le=100_000)  # training problems per template and level (0: logs only)
    heldout_per_template: int = bounded(3, ge=0, le=100_000)  # held-out instances per template and level
    family_per_template: int = bounded(8, ge=0, le=100_000)  # problems per template and level of each held-out family
    task_seed: int = bounded(0, ge=0, le=MAX_SEED)
    completions: int = bounded(4, ge=1, le=1024)  # sampled per problem
    temperature: float = bounded(0.8, gt=0, le=100)
    top_p: float = bounded(0.95, gt=0, le=1)
    max_new_tokens: int = bounded(160, ge=1, le=1 << 16)
    batch: int = bounded(8, ge=1, le=4096)  # problems decoded together (x completions sequences)
    seed: int = bounded(0, ge=0, le=MAX_SEED)


def sampling_problems(cfg: SampleConfig, heldout_families: Sequence[str]) -> list[Problem]:
    """The procedural problems to sample: training and
    held-out instances of `cfg.families`, problems of each held-out family; task ids as the
    RLAIF recipe's (`mlxcore.rl.tasks.build`), interleaved over templates."""
    def group(fams, split, count, label):
        return [tasks.instances(f, t, lv, split, count, cfg.task_seed, label)
                for f in fams for t in tasks.template_names(f) for lv in cfg.difficulty if count]

    return (tasks.interleave(group(cfg.families, "train", cfg.train_per_template, "train"))
            + tasks.interleave(group(cfg.families, "heldout", cfg.heldout_per_template, "heldout"))
            + tasks.interleave(group(heldout_families, "heldout", cfg.family_per_template, "family")))


def chunks_done(path: Path, sizes: Sequence[int]) -> int:
    """How many leading sampling chunks the log at `path` holds whole (chunk k's lines carry
    step k + 1 and number sizes[k]); 0 without a log."""
    if not path.is_file():
        return 0
    counts: dict[int, int] = {}
    for row in rollout_log.read_rows(path):
        counts[row.get("step")] = counts.get(row.get("step"), 0) + 1
    done = 0
    while done < len(sizes) and counts.get(done + 1) == sizes[done]:
        done += 1
    return done


def sample_rollouts(policy, problems: Sequence[Problem], cfg: SampleConfig, judge: CodeJudge, log: rollout_log.RolloutLog,
                    start_chunk: int = 0, instruction: Callable[[Problem], str] | None = None) -> None:
    """Sample `cfg.completions` per problem from `policy`, `cfg.batch` problems at a time
    (chunk k seeded by (cfg.seed, k): the same texts whether or not the run was resumed),
    judge them in the sandbox and append them to `log` (step k + 1), from `start_chunk` on."""
    from mlxio.rl.evaluation import instruction as default_instruction
    from mlxio.rl.rollout import generate_group
    from mlxio.run.reporting import progress

    ask = instruction or default_instruction
    starts = range(start_chunk * cfg.batch, len(problems), cfg.batch)
    for k, start in enumerate(progress(starts, desc="sample rollouts", unit="chunk", every_s=30.0), start_chunk):
        chunk = problems[start:start + cfg.batch]
        ro = generate_group(policy, [ask(p) for p in chunk], cfg.completions, cfg.temperature, cfg.top_p,
                            cfg.max_new_tokens, hashed_int(f"judge-sample:{cfg.seed}:{k}", 4), stop_at_code_end=True)
        answered = [chunk[i] for i in ro.prompt_index]
        passed = judge.passed(answered, ro.texts)
        execution = np.array([np.nan if v is None else float(v) for v in passed])
        log.write_step(k + 1, answered, ro.texts, {"execution": execution})


def chunk_sizes(n_problems: int, cfg: SampleConfig) -> list[int]:
    """Lines per sampling chunk: cfg.batch problems (the last may hold fewer) x completions."""
    return [min(cfg.batch, n_problems - s) * cfg.completions for s in range(0, n_problems, cfg.batch)]
