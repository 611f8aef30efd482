"""Sizes read from a request or a file are checked before work starts: a prompt against the
model's positions (the worker answers a 4.5 MB prompt with one error at once and goes on), a
kernel cache archive's members, their count and total size, and what the archive is (a device, a
FIFO or a folder is refused before anything is read)."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio.errors import DataError
from mlxio.gpu import kernel_cache


@pytest.fixture(scope="module")
def worker_call(tmp_path_factory):
    from mlxio import rpc
    from mlxio.run.config import to_dict
    from recipes.rlaif_config import PRESETS
    from recipes.rlaif_worker import make_worker

    server = make_worker().server()

    def call(method, **params):
        line = rpc.encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        return json.loads(server.handle_line(line.rstrip(b"\n")))

    cfg = {**to_dict(PRESETS["smoke"]), "out_dir": str(tmp_path_factory.mktemp("worker"))}
    assert "result" in call("initialize", preset="smoke", config=cfg)
    return call


@pytest.mark.parametrize(("prompt", "words"), [
    ("x" * (4_500_000), "characters cannot fit"),  # refused before tokenising
    ("x" * 2100, "tokens + 4 new tokens is more than the model's max_position_embeddings (2048)"),
])
def test_a_prompt_longer_than_the_model_is_one_error_and_the_worker_goes_on(worker_call, prompt, words):
    from mlxio import rpc

    answer = worker_call("generate", prompts=["ok", prompt], n=1, max_tokens=4)
    error = answer["error"]
    assert error["code"] == rpc.INVALID_PARAMS and "params.prompts[1]" in error["message"], answer
    assert words in error["message"]
    assert "result" in worker_call("generate", prompts=["x" * 1000], n=1, max_tokens=4)  # within: answered


# ------------------------------------------------------------------------ kernel cache archives

def _archive(path, members: list[tuple[str, bytes | None, bytes]]) -> None:
    """A .tar.gz of (name, type flag or None for a file, data) members."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if kind is not None:
                info.type, info.size, info.linkname = kind, 0, "/etc/passwd"
            tar.addfile(info, io.BytesIO(data) if kind is None else None)


MANIFEST = (kernel_cache.MANIFEST, None, json.dumps({"mlx": None, "gpu_arch": None}).encode())


def _refused(path, dest, words):
    with pytest.raises(DataError, match=words) as caught:
        kernel_cache.import_cache(path, str(dest))
    assert "\n" not in caught.value.contract_line() and str(path) in caught.value.contract_line()
    assert not dest.exists() or list(dest.rglob("*")) == []


@pytest.mark.parametrize(("manifest", "words"), [
    (b"[1, 2]", "not a kernel cache manifest"), (b'"ptx"', "not a kernel cache manifest"),
    (b"[" * 100_000 + b"]" * 100_000, "not a kernel cache manifest"), (b'{"mlx": [1]}', "not a kernel cache manifest"),
    (b"\xff\xfe", "not a kernel cache manifest"),
])
def test_a_manifest_that_is_not_an_object_is_one_line(tmp_path, manifest, words):
    path = tmp_path / "k.tar.gz"
    _archive(path, [(kernel_cache.MANIFEST, None, manifest), ("ptx/a.ptx", None, b"x")])
    _refused(path, tmp_path / "dest", words)


@given(name=st.one_of(
    st.lists(st.sampled_from(["..", ".", "", "a", "ptx", "b.ptx"]), min_size=1, max_size=5).map("/".join),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20).map(lambda t: "ptx/../" + t),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20).map(lambda t: "/" + t)))
def test_a_member_outside_ptx_or_not_normalised_is_refused(tmp_path_factory, name):
    parts = name.split("/")
    plain = len(parts) >= 2 and parts[0] == "ptx" and all(p not in ("", ".", "..") for p in parts[1:]) and "\0" not in name
    if plain or name == kernel_cache.MANIFEST:
        return
    root = tmp_path_factory.mktemp("archive")
    path = root / "k.tar.gz"
    try:
        _archive(path, [MANIFEST, (name, None, b"payload")])
    except (ValueError, UnicodeEncodeError):  # a name tar cannot hold (NUL)
        return
    _refused(path, root / "dest", "not a kernel cache archive")
    assert not (root / "payload").exists() and not any(p.name == "payload" for p in root.rglob("*"))


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE])
def test_a_member_that_is_no_regular_file_is_refused(tmp_path, kind):
    path = tmp_path / "k.tar.gz"
    _archive(path, [MANIFEST, ("ptx/a.ptx", kind, b"")])
    _refused(path, tmp_path / "dest", "not a regular file")


def test_counts_and_sizes_are_checked_from_the_headers(tmp_path, monkeypatch):
    path = tmp_path / "k.tar.gz"
    _archive(path, [MANIFEST] + [(f"ptx/{i}.ptx", None, b"x" * 10) for i in range(5)])
    monkeypatch.setattr(kernel_cache, "MAX_MEMBERS", 4)
    _refused(path, tmp_path / "dest", "more than 4 members")
    monkeypatch.setattr(kernel_cache, "MAX_MEMBERS", 100)
    monkeypatch.setattr(kernel_cache, "MAX_UNPACKED_BYTES", 45)
    _refused(path, tmp_path / "dest", "unpacks to more than")
    monkeypatch.setattr(kernel_cache, "MAX_UNPACKED_BYTES", 50)
    assert kernel_cache.import_cache(path, str(tmp_path / "dest"))["added"] == 5


@pytest.mark.parametrize("what", ["/dev/zero", "fifo", "folder", "link to /dev/zero", "empty", "garbage"])
def test_an_archive_that_is_no_regular_tar_is_refused_at_once(tmp_path, what):
    path = {"/dev/zero": "/dev/zero", "fifo": tmp_path / "f", "folder": tmp_path / "d",
            "link to /dev/zero": tmp_path / "z", "empty": tmp_path / "e", "garbage": tmp_path / "g"}[what]
    if what == "fifo":
        os.mkfifo(path)
    elif what == "folder":
        path.mkdir()
    elif what == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif what == "empty":
        path.write_bytes(b"")
    elif what == "garbage":
        path.write_bytes(os.urandom(4096))
    with pytest.raises(DataError) as caught:
        kernel_cache.import_cache(path, str(tmp_path / "dest"))
    assert "\n" not in caught.value.contract_line()


def test_a_link_planted_in_the_cache_folder_is_refused(tmp_path):
    path = tmp_path / "k.tar.gz"
    _archive(path, [MANIFEST, ("ptx/sub/a.ptx", None, b"kernel")])
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "sub").symlink_to(elsewhere)
    from mlxio.errors import DiskError

    with pytest.raises(DiskError, match="symbolic link"):
        kernel_cache.import_cache(path, str(dest))
    assert list(elsewhere.iterdir()) == []


def test_a_problem_longer_than_the_model_is_refused_before_training(tmp_path, capsys):
    """A problems file whose one prompt cannot fit the model's positions: one line naming the
    problem before any step (it failed, or grew, at the step that sampled it)."""
    from tests.recipes.test_bad_inputs import assert_line

    rows = [{"task_id": f"T/{i}", "prompt": f"def add{i}(a, b):\n", "entry_point": f"add{i}",
             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"} for i in range(8)]
    rows[3]["prompt"] = "# " + "x" * 5000 + "\ndef add3(a, b):\n"
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert_line("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(tmp_path / "run"), "--data.problems", str(problems),
                               "--eval.before", "false", "--eval.after", "false"], capsys, 1,
                "'T/3'", "max_position_embeddings (2048)", str(problems))
    assert not (tmp_path / "run" / "checkpoints").exists()


# ------------------------------------------------------------------------ token cache meta

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)


@given(meta=st.one_of(JSON, st.fixed_dictionaries({"fields": JSON, "n": JSON, "max_lengths": JSON}),
                      st.fixed_dictionaries({"fields": st.just(["q"]), "n": st.integers(-5, 2**50),
                                             "max_lengths": st.fixed_dictionaries({"q": st.integers(-2, 2**50)})})))
def test_a_token_cache_meta_of_any_shape_is_one_line_or_opens(tmp_path_factory, meta):
    from mlxio.data.token_cache import build_or_open, open_cache

    cache = build_or_open(tmp_path_factory.mktemp("tc"), {"q": ["a", "bb", "ccc"]},
                          lambda texts, n: [[1] * len(t) for t in texts], tokenizer_id="t", max_lengths={"q": 4})
    (cache.path / "meta.json").write_text(json.dumps(meta))
    try:
        opened = open_cache(cache.path)
    except DataError as err:
        assert "\n" not in err.contract_line()
        return
    assert opened.n == 3 and opened.max_lengths["q"] >= 3  # only the true sizes open
