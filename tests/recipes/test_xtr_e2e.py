"""End to end: `python -m recipes.xtr_lora --preset smoke` on the real MiniLM and stdlib pairs.

Trains, checkpoints, evaluates and exports; a run stopped half-way and resumed gives
bit-identical LoRA weights and optimizer state; the merged export loads in transformers and
the PEFT adapter in peft with the same token embeddings as MLX; the index/search command runs.
"""

import json

import mlx.core as mx
import numpy as np
import pytest
import tracking_files  # noqa: I001  (tests/ helper)

from mlxcore.retrieval import late_interaction, objective
from mlxcore.retrieval.encoder import token_embeddings
from mlxcore.train.tree import combine, flatten
from mlxio.errors import CheckpointError
from mlxio.run import checkpoint
from mlxio.weights.encoders import default_encoder_path, load_encoder, tokenize
from recipes import code_search, xtr_lora, xtr_lora_config

pytestmark = pytest.mark.slow
SNIPPETS = ["def add(a, b):\n    return a + b", "Parse a date string into a datetime object.",
            "class Stack:\n    def push(self, item):\n        self.items.append(item)"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("xtr")
    args = ["--preset", "smoke", "--cache_dir", str(root / "cache")]
    full = xtr_lora.main([*args, "--out_dir", str(root / "full")])
    return root, args, full


def final_trees(run_dir):
    _, trees, meta = checkpoint.load_latest(run_dir)
    return trees, meta


def test_artefacts_and_metrics(run):
    root, _, results = run
    out = root / "full"
    for name in ("config.json", "eval.json", "metrics.jsonl", "curves.png", "merged/model.safetensors",
                 "merged/tokenizer.json", "peft_adapter/adapter_config.json", "peft_adapter/adapter_model.safetensors"):
        assert (out / name).is_file(), name
    evaluated = json.loads((out / "eval.json").read_text())
    for model in ("untrained", "fine-tuned"):
        for mode in ("semantic", "hybrid"):
            assert 0.0 <= evaluated[model][mode]["mrr@10"] <= 1.0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert all(np.isfinite(r["loss"]) and r["skipped"] == 0 for r in records)
    trees, meta = final_trees(out)
    assert meta["step"] == 8
    assert any(float(mx.abs(v).max()) > 0 for k, v in flatten(trees["trainable"]).items() if k.endswith("lora_b"))


def test_training_lowers_the_loss_on_training_batches(run):
    root, _, _ = run
    cfg = xtr_lora_config.PRESETS["smoke"]
    encoder = load_encoder(default_encoder_path(), lora_scale=cfg.lora.scale)
    trees, _ = final_trees(root / "full")
    trained = combine(encoder.params, trees["trainable"])
    loss_fn = objective.contrastive_loss_fn(encoder.spec, cfg.loss)
    from mlxio.data import xtr_data
    train_pairs, _ = xtr_data.load_task(cfg.data, root / "cache", cfg.train.seed)
    batch = train_pairs[:16]
    q_ids, q_mask = tokenize(encoder.tokenizer, [p.query for p in batch], cfg.data.max_query_len)
    d_ids, d_mask = tokenize(encoder.tokenizer, [p.code for p in batch], cfg.data.max_doc_len)
    arrays = {"query_ids": mx.array(q_ids), "query_mask": mx.array(q_mask),
              "doc_ids": mx.array(d_ids), "doc_mask": mx.array(d_mask)}
    before, _ = loss_fn(encoder.params, arrays, mx.random.key(0))
    after, _ = loss_fn(trained, arrays, mx.random.key(0))
    assert float(after) < float(before)


def test_stop_and_resume_is_bit_identical(run):
    """Stopped at 4 and resumed: the same weights. This run logs every 2 steps to metrics.jsonl,
    TensorBoard and W&B (offline): each record is the mean of the full run's two steps."""
    root, args, _ = run
    part = str(root / "resumed")
    report = ["--train.log_every", "2", "--report_to", "tensorboard,wandb"]
    assert xtr_lora.main([*args, *report, "--out_dir", part, "--stop_after", "4"]) == {"stopped_at": 4}
    xtr_lora.main([*args, *report, "--out_dir", part, "--resume", "--export", "false"])
    full, full_meta = final_trees(root / "full")
    resumed, resumed_meta = final_trees(root / "resumed")
    assert resumed_meta["step"] == full_meta["step"] == 8
    for name in ("trainable", "opt_state"):
        a, b = flatten(full[name]), flatten(resumed[name])
        assert a.keys() == b.keys()
        for key in a:
            assert mx.array_equal(a[key], b[key]), (name, key)
    full_log = [json.loads(line) for line in (root / "full" / "metrics.jsonl").read_text().splitlines()]
    windows = [json.loads(line) for line in (root / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in windows] == [2, 4, 6, 8] and all(r["window_steps"] == 2 for r in windows)
    for record in windows:
        pair = full_log[record["step"] - 2:record["step"]]
        for key in ("loss", "info_nce", "margin", "grad_norm"):
            assert record[key] == pytest.approx((pair[0][key] + pair[1][key]) / 2, rel=1e-6), key
        assert record["lr"] == pair[1]["lr"]
    tb = tracking_files.tensorboard_scalars(root / "resumed" / "tensorboard")
    assert [s for s, _ in tb["loss"]] == [2, 4, 6, 8]
    np.testing.assert_allclose([v for _, v in tb["loss"]], [r["loss"] for r in windows], rtol=1e-6)
    history = [h for h in tracking_files.wandb_history(root / "resumed") if "loss" in h]
    assert [h["_step"] for h in history] == [2, 4, 6, 8]
    np.testing.assert_allclose([h["loss"] for h in history], [r["loss"] for r in windows], rtol=1e-6)
    # the run's result, the evaluation, reaches both trackers too (at the last step)
    evaluated = json.loads((root / "resumed" / "eval.json").read_text())
    key = "eval/files/fine-tuned/semantic/mrr@10"
    assert tb[key] == [(8, pytest.approx(evaluated["fine-tuned"]["semantic"]["mrr@10"]))]
    rows = [h for h in tracking_files.wandb_history(root / "resumed") if key in h]
    assert [h["_step"] for h in rows] == [8] and rows[0][key] == pytest.approx(evaluated["fine-tuned"]["semantic"]["mrr@10"])


def test_resume_refuses_another_config(run):
    root, args, _ = run
    before = {p.name: p.read_bytes() for p in (root / "full").iterdir() if p.is_file()}
    with pytest.raises(CheckpointError, match=r"config_hash differs.*changed: optim.lr: 0.001 -> 0.5"):
        xtr_lora.main([*args, "--out_dir", str(root / "full"), "--resume", "--optim.lr", "0.5"])
    after = {p.name: p.read_bytes() for p in (root / "full").iterdir() if p.is_file()}
    assert after == before  # a refused resume writes nothing (config.json included)


def test_resume_of_a_checkpoint_written_before_the_memory_options(run, tmp_path, caplog):
    """The full run's step-4 checkpoint as a run before the memory.* options recorded it (no
    memory section, its hash over that config): --resume continues it, saying so once, while
    this run leaves memory.* at the defaults; with one of them set otherwise it is refused,
    naming that setting."""
    root, args, _ = run
    path = root / "full" / checkpoint.CHECKPOINTS / "step-00000004"
    trees, meta = checkpoint.load(path)
    out = tmp_path / "old"
    old = {k: v for k, v in meta["config"].items() if k != "memory"} | {"out_dir": str(out)}
    checkpoint.save(out, 4, trees, {**meta, "config": old, "config_hash": xtr_lora_config.trajectory_hash(old)})
    with pytest.raises(CheckpointError, match=r"changed: memory.max_micro_batch: '<absent>' -> 32 \(not in the "
                                              r"checkpoint's config; it resumes with the default 64\)$"):
        xtr_lora.main([*args, "--out_dir", str(out), "--resume", "--memory.max_micro_batch", "32"])
    caplog.clear()
    assert xtr_lora.main([*args, "--out_dir", str(out), "--resume", "--stop_after", "5"]) == {"stopped_at": 5}
    notes = [r.getMessage() for r in caplog.records if "existed" in r.getMessage()]
    assert len(notes) == 1 and "before memory.auto_batch" in notes[0], notes
    assert sorted(checkpoint.step_numbers(out)) == [4, 5]


def mlx_token_embeddings(params, spec, tokenizer):
    ids, mask = tokenize(tokenizer, SNIPPETS, 64)
    return np.array(token_embeddings(params, mx.array(ids), mx.array(mask), spec)), ids, mask


def trained_embeddings(root):
    """MLX token embeddings [3, T, 384] of SNIPPETS under the smoke run's final LoRA, with ids/mask."""
    encoder = load_encoder(default_encoder_path(), lora_scale=xtr_lora_config.PRESETS["smoke"].lora.scale)
    trees, _ = final_trees(root / "full")
    return mlx_token_embeddings(combine(encoder.params, trees["trainable"]), encoder.spec, encoder.tokenizer)


def torch_embeddings(torch, model, ids, mask):
    """Unit-norm last hidden states of a PyTorch model on the same ids/mask."""
    with torch.no_grad():
        hidden = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                              attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state
    return torch.nn.functional.normalize(hidden, dim=-1).numpy()


def test_merged_export_matches_in_transformers(run):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    root, _, _ = run
    ours, ids, mask = trained_embeddings(root)
    theirs = torch_embeddings(torch, transformers.AutoModel.from_pretrained(root / "full" / "merged"), ids, mask)
    np.testing.assert_allclose(theirs[mask], ours[mask], atol=1e-4)
    merged = load_encoder(root / "full" / "merged")  # and it loads back into MLX
    again, _, _ = mlx_token_embeddings(merged.params, merged.spec, merged.tokenizer)
    np.testing.assert_allclose(again[mask], ours[mask], atol=1e-4)


def test_peft_adapter_loads_in_peft(run):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    root, _, _ = run
    ours, ids, mask = trained_embeddings(root)
    base = transformers.AutoModel.from_pretrained(default_encoder_path())
    model = peft.PeftModel.from_pretrained(base, root / "full" / "peft_adapter")
    theirs = torch_embeddings(torch, model, ids, mask)
    np.testing.assert_allclose(theirs[mask], ours[mask], atol=1e-4)


def test_index_and_search(run, tmp_path, capsys):
    root, _, _ = run
    source = tmp_path / "src"
    source.mkdir()
    (source / "util.py").write_text(
        "def parse_date(text):\n    '''Parse a date.'''\n    day, month, year = text.split('/')\n"
        "    return int(year), int(month), int(day)\n\n\n"
        "def add_numbers(a, b):\n    total = a + b\n    return total\n\n\n"
        "def read_lines(path):\n    with open(path) as handle:\n        return handle.read().splitlines()\n")
    index = tmp_path / "index"
    code_search.main(["index", str(source), "--model", str(root / "full" / "merged"), "--index", str(index)])
    code_search.main(["search", "--index", str(index), "--mode", "hybrid", "parse a date string", "--top-k", "2"])
    printed = capsys.readouterr().out
    assert "util.py:1 parse_date" in printed.splitlines()[1]
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "q1", "query": "add two numbers"}\n{"id": "q2", "query": "read all lines from a file path"}\n')
    rankings = tmp_path / "r.jsonl"
    for mode, extra in (("semantic", []), ("bm25", []), ("hybrid", []), ("hybrid", ["--alpha", "0.8"])):
        code_search.main(["search", "--index", str(index), "--mode", mode, "--queries", str(queries),
                          "--output", str(rankings), "--top-k", "3", *extra])
        rows = [json.loads(line) for line in rankings.read_text().splitlines()]
        assert [r["query_id"] for r in rows] == ["q1", "q2"]
        # bm25 returns only documents sharing a term with the query (no zero-score padding)
        assert all(len(r["doc_ids"]) == 3 if mode != "bm25" else 1 <= len(r["doc_ids"]) <= 3 for r in rows)
        assert rows[0]["doc_ids"][0].endswith("add_numbers"), (mode, rows)
        assert rows[1]["doc_ids"][0].endswith("read_lines"), (mode, rows)


QUERIES = ["add two numbers", "parse a date string", "push an item on a stack"]


def trained_params(root):
    encoder = load_encoder(default_encoder_path(), lora_scale=xtr_lora_config.PRESETS["smoke"].lora.scale)
    trees, _ = final_trees(root / "full")
    return combine(encoder.params, trees["trainable"]), encoder


def test_exports_name_their_base_and_carry_cards(run):
    root, _, _ = run
    out = root / "full"
    peft_config = json.loads((out / "peft_adapter" / "adapter_config.json").read_text())
    assert peft_config["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    for folder in ("colbert", "merged", "peft_adapter"):
        card = (out / folder / "README.md").read_text()
        assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in card, folder
        assert "python -m recipes.xtr_lora" in card and "mrr@10" in card, folder
    assert "single-vector view" in (out / "merged" / "README.md").read_text()


def test_pylate_loads_the_trained_multivector_model(run):
    """PyLate's ColBERT loads colbert/ as the trained model (its modules, no random layer) and
    its MaxSim scores equal MLX's (PyLate sums over query tokens, MLX averages)."""
    pytest.importorskip("torch")
    pytest.importorskip("pylate")
    from pylate import models, scores

    root, _, _ = run
    model = models.ColBERT(str(root / "full" / "colbert"), device="cpu")
    assert len(model) == 2 and model[1].linear.weight.shape == (384, 384)
    np.testing.assert_array_equal(model[1].linear.weight.detach().numpy(), np.eye(384, dtype=np.float32))
    assert (model.query_prefix, model.document_prefix, model.do_query_expansion) == ("", "", False)
    params, encoder = trained_params(root)
    q_ids, q_mask = tokenize(encoder.tokenizer, QUERIES, 32)
    d_ids, d_mask = tokenize(encoder.tokenizer, SNIPPETS, 64)
    q = token_embeddings(params, mx.array(q_ids), mx.array(q_mask), encoder.spec)
    d = token_embeddings(params, mx.array(d_ids), mx.array(d_mask), encoder.spec)
    ours = np.array(late_interaction.maxsim(q, mx.array(q_mask), d, mx.array(d_mask)))
    ours_sum = ours * np.asarray(q_mask).sum(1, keepdims=True)
    pq = model.encode(QUERIES, is_query=True)
    pd = model.encode(SNIPPETS, is_query=False)
    for i, emb in enumerate(pd):  # the same token embeddings, token for token
        np.testing.assert_allclose(emb, np.array(d[i])[np.asarray(d_mask[i], bool)], atol=1e-4)
    theirs = np.array([[float(scores.colbert_scores(qi[None], di[None])[0, 0]) for di in pd] for qi in pq])
    print(f"PyLate vs MLX MaxSim: max |diff| {np.abs(theirs - ours_sum).max():.2e}")
    np.testing.assert_allclose(theirs, ours_sum, atol=1e-3)
    assert (theirs.argmax(1) == ours.argmax(1)).all()


def test_sentence_transformers_loads_the_single_vector_view(run):
    """merged/ in sentence-transformers: its mean pooling of the fine-tuned token states, equal
    to the same pooling of MLX's hidden states; cosine scores agree."""
    pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers")
    from mlxcore.retrieval.encoder import hidden_states

    root, _, _ = run
    model = st.SentenceTransformer(str(root / "full" / "merged"), device="cpu")
    params, encoder = trained_params(root)

    def mlx_sentence(texts):
        ids, mask = tokenize(encoder.tokenizer, texts, 128)
        h = np.array(hidden_states(params, mx.array(ids), mx.array(mask), encoder.spec))
        m = np.asarray(mask, np.float32)[..., None]
        pooled = (h * m).sum(1) / m.sum(1)
        return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)

    q, d = mlx_sentence(QUERIES), mlx_sentence(SNIPPETS)
    sq, sd = model.encode(QUERIES), model.encode(SNIPPETS)
    np.testing.assert_allclose(sq, q, atol=1e-4)
    np.testing.assert_allclose(sd, d, atol=1e-4)
    np.testing.assert_allclose(model.similarity(sq, sd).numpy(), q @ d.T, atol=1e-4)
    from mlxio.search import embeddings  # what the recipe evaluates as merged/'s view
    np.testing.assert_allclose(embeddings.embed_pooled(params, encoder.spec, encoder.tokenizer, SNIPPETS, 128),
                               sd, atol=1e-4)
    view = json.loads((root / "full" / "eval.json").read_text())["single-vector view"]["semantic"]
    assert 0.0 <= view["mrr@10"] <= 1.0
    assert "single-vector view semantic: " in (root / "full" / "merged" / "README.md").read_text()
