"""Credentials out of everything a run writes or prints: the `user:pass@` of a URL, secrets in a
URL's query (`?api_key=...`), and config fields that hold a key or token.

    redact_text("teacher http://bob:hunter2@host/v1: timed out") == "teacher http://***@host/v1: timed out"
    redact_config({"teacher": {"url": "http://bob:pw@h/v1", "api_key": "sk-1"}})
        == {"teacher": {"url": "http://***@h/v1", "api_key": "***"}}

Applied where the config is written (config.json, checkpoint meta, W&B) and where text leaves the
process (the one error line of `cli_main`, every log record through `LogRedactor`).
"""

from __future__ import annotations

import logging
import re
from typing import Any

MASK = "***"

# scheme://userinfo@ : as urlsplit reads it, up to the last '@' before the first '/', '?' or '#'
# (a raw '@' inside a password included)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,31}://)[^\s/?#]{1,1024}@")
# ?key=value / &key=value of a secret-named parameter (name ending in one of these words)
_SECRET_WORDS = r"(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|password|passwd|pwd|signature|sig|key)"
_QUERY = re.compile(r"(?i)([?&][a-z0-9_.-]{0,64}?" + _SECRET_WORDS + r"=)[^&#\s]{1,4096}")
# a config field whose name says it holds a credential
_SECRET_FIELD = re.compile(r"(?i)^(?:.*[_-])?(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|bearer|"
                           r"secret|client[_-]?secret|password|passwd|credentials?|authorization)$")


def redact_text(text: str) -> str:
    """`text` with every URL's `user[:password]@` and every secret-named query value masked."""
    if "://" not in text and "=" not in text:
        return text
    return _QUERY.sub(lambda m: m.group(1) + MASK, _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text))


def secret_field(name: str) -> bool:
    """Whether a config key names a credential (`api_key`, `teacher_token`... not `max_tokens`)."""
    return bool(_SECRET_FIELD.match(name)) or name.lower() in ("token", "hf_token", "wandb_key")


def redact_config(value: Any) -> Any:
    """A copy of a JSON-like config (dicts, lists, strings, numbers) with credential fields'
    non-empty values masked and credentials inside every string removed (`redact_text`)."""
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and secret_field(k) and v not in (None, "") else redact_config(v))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_config(v) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value


class LogRedactor(logging.Filter):
    """A handler filter that rewrites each record's message with `redact_text` (once formatted)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: let the handler report it as usual
            return True
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add a `LogRedactor` to every handler of `logger` (default: the root logger) lacking one."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, LogRedactor) for f in handler.filters):
            handler.addFilter(LogRedactor())
