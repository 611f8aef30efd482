"""The worker's `save` writes its run folder as the recipes do: a link planted at the folder's
lock, its checkpoints folder or LATEST is one error answer naming it, the file behind the link
keeps its bytes, and the worker answers the next request."""

from __future__ import annotations

import json
import os

import pytest

VICTIM = b"someone else's file\n"


@pytest.fixture(scope="module")
def call(tmp_path_factory):
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


@pytest.mark.parametrize(("name", "kind"), [(".lock", "symlink"), (".lock", "hard link"), (".lock", "dangling"),
                                            ("checkpoints", "folder link"), ("checkpoints/LATEST", "symlink")])
def test_save_never_writes_through_a_link(call, tmp_path, name, kind):
    folder, victim = tmp_path / "save", tmp_path / "victim"
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    if kind == "folder link":
        victim.mkdir()
        (folder / name).symlink_to(victim, target_is_directory=True)
    elif kind == "dangling":
        (folder / name).symlink_to(victim)
    else:
        victim.write_bytes(VICTIM)
        (folder / name).symlink_to(victim) if kind == "symlink" else os.link(victim, folder / name)
    answer = call("save", dir=str(folder))
    message = answer["error"]["message"]
    assert "\n" not in message and str(folder / name) in message, answer
    if kind == "folder link":
        assert list(victim.iterdir()) == []
    elif kind == "dangling":
        assert not os.path.lexists(victim)
    else:
        assert victim.read_bytes() == VICTIM
    assert "result" in call("save", dir=str(tmp_path / "plain"))  # and it goes on
    assert (tmp_path / "plain" / "checkpoints" / "LATEST").is_file()
