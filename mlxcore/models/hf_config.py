"""Encoder shapes read from a transformers `config.json` dict: one reader for every encoder's
config class (BERT, T5), which declares its fields under transformers' names.

A field without a default is required; one with a default reads the key if present, cast to
the default's type (int / float); a field declared with `choice` must hold one of its values.
`gradient_checkpointing` is a training choice, never read from the file.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs


def choice(default: str, options: tuple[str, ...]) -> Any:
    """A string field that must be one of `options` (checked on construction and in `from_hf`)."""
    return attrs.field(default=default, validator=attrs.validators.in_(options), metadata={"choices": options})


@attrs.frozen(kw_only=True)
class HFConfig:
    """Base of an encoder's shape config (names as in transformers' config of that model)."""

    MODEL: ClassVar[str] = ""  # named in errors: "BERT", "T5"

    vocab_size: int
    gradient_checkpointing: bool = False  # not in HF's config: a training choice

    @classmethod
    def from_hf(cls, config: dict):
        """From a transformers `config.json` dict; ValueError naming the key on bad input."""
        fields = [f for f in attrs.fields(cls) if f.name != "gradient_checkpointing"]
        missing = [f.name for f in fields if f.default is attrs.NOTHING and f.name not in config]
        if missing:
            raise ValueError(f"{cls.MODEL} config lacks key(s) {missing}")
        values = {}
        for f in fields:
            if f.default is attrs.NOTHING:
                values[f.name] = int(config[f.name])
            elif "choices" in f.metadata:
                values[f.name] = config.get(f.name, f.default)
                if values[f.name] not in f.metadata["choices"]:
                    raise ValueError(f"{cls.MODEL} config key {f.name!r}={values[f.name]!r}: supported "
                                     f"{f.metadata['choices']}")
            else:
                values[f.name] = type(f.default)(config.get(f.name, f.default))
        cls.check_hf(config)
        return cls(**values)

    @classmethod
    def check_hf(cls, config: dict) -> None:
        """Checks of keys the config class does not hold (ValueError naming the key)."""
