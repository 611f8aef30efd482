"""No credential leaves the process: a URL's `user:pass@` and secret query values, and config fields
that hold a key, are masked in config.json, the lock file, log lines and the one error line."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio.errors import ConfigError, cli_main
from mlxio.redact import MASK, LogRedactor, redact_config, redact_text
from mlxio.run import context
from mlxio.run.checks import check_url

# what a password may hold inside a URL's userinfo (RFC 3986 unreserved + sub-delims + %-escapes, and the
# raw '@' people type anyway: urlsplit takes the last one)
SECRET = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=%:@"),
                 min_size=6, max_size=40).map(lambda s: "Zq" + s)  # never a substring of the rest by chance
USER = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-._~"), min_size=1, max_size=12)
HOST = st.sampled_from(["127.0.0.1", "teacher.example.com", "[::1]", "localhost"])
SCHEME = st.sampled_from(["http", "https", "HTTP", "redis", "postgresql+psycopg"])
PAD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="@"), max_size=30)


@given(scheme=SCHEME, user=USER, secret=SECRET, host=HOST, port=st.integers(1, 65535), before=PAD, after=PAD)
def test_userinfo_is_masked_wherever_the_url_sits(scheme, user, secret, host, port, before, after):
    url = f"{scheme}://{user}:{secret}@{host}:{port}/v1"
    text = f"{before} {url} {after}"
    clean = redact_text(text)
    assert secret not in clean and f"{user}:" not in clean.split("://", 1)[-1].split("/")[0]
    assert f"{scheme}://{MASK}@{host}:{port}/v1" in clean
    assert redact_text(clean) == clean  # idempotent


@given(name=st.sampled_from(["api_key", "apikey", "access_token", "token", "key", "password", "sig"]),
       secret=SECRET.map(lambda s: s.replace("&", "").replace("#", "")))
def test_secret_query_values_are_masked(name, secret):
    clean = redact_text(f"GET https://h.example/v1?model=m&{name}={secret}&n=2")
    assert secret not in clean and f"{name}={MASK}&n=2" in clean and "model=m" in clean


@given(text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="@?&")))
def test_text_without_urls_or_queries_is_unchanged(text):
    assert redact_text(text) == text


def test_config_fields_holding_credentials_are_masked():
    config = {"teacher": {"url": "http://bob:hunter2@h:8080/v1", "api_key": "sk-123", "model": "default",
                          "auth_token": "t", "max_tokens": 256},
              "wandb_key": "w", "lora": {"targets": ["query"], "password": None},
              "data": {"source": "https://pypi.org/simple?token=abc"}}
    clean = redact_config(config)
    assert clean["teacher"] == {"url": "http://***@h:8080/v1", "api_key": MASK, "model": "default",
                                "auth_token": MASK, "max_tokens": 256}
    assert clean["wandb_key"] == MASK and clean["lora"] == {"targets": ["query"], "password": None}
    assert clean["data"]["source"] == "https://pypi.org/simple?token=***"
    assert config["teacher"]["api_key"] == "sk-123"  # a copy


def test_config_json_and_lock_file_hold_no_password(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["rlaif_qwen", "--teacher.url", "http://bob:hunter2@127.0.0.1:9/v1"])
    out = tmp_path / "run"
    try:
        context.start(out, {"teacher": {"url": "http://bob:hunter2@127.0.0.1:9/v1"}}, seed=0)
        for path in out.rglob("*"):
            assert b"hunter2" not in path.read_bytes(), path
        assert json.loads((out / "config.json").read_text())["teacher"]["url"] == "http://***@127.0.0.1:9/v1"
    finally:
        context.release_out_dir(out)


def test_log_lines_are_redacted():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = Keep()
    handler.addFilter(LogRedactor())
    log = logging.getLogger("test_redact")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("teacher %s: %s", "http://bob:hunter2@h/v1/chat/completions", "timed out")
    finally:
        log.removeHandler(handler)
    assert records == ["teacher http://***@h/v1/chat/completions: timed out"]


def test_the_error_line_is_redacted(capsys):
    def fail(argv):
        check_url("teacher.url", "ftp://bob:hunter2@h/v1")

    with pytest.raises(SystemExit):
        cli_main("rlaif", fail, [])
    err = capsys.readouterr().err
    assert "hunter2" not in err and "ftp://***@h/v1" in err and len(err.strip().splitlines()) == 1

    def fail_raw(argv):
        raise ConfigError("teacher.url 'http://bob:hunter2@h/v1?api_key=sk-9' is refused")

    with pytest.raises(SystemExit):
        cli_main("rlaif", fail_raw, [])
    err = capsys.readouterr().err
    assert "hunter2" not in err and "sk-9" not in err


def test_worker_error_responses_are_redacted():
    from mlxio import rpc

    err = rpc.RpcError(rpc.INVALID_PARAMS, "params.config.teacher.url: 'http://bob:hunter2@h/v1' is refused")
    assert "hunter2" not in json.dumps(err.to_json()) and "http://***@h/v1" in err.to_json()["message"]
