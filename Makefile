# Two commands on a fresh machine: `make train` (the main job on the embedded default) and
# `make test` (the test suite). Each creates .venv and installs what it needs on first use:
# training needs no PyTorch; the tests' peers (PyTorch, PEFT, ...) come with `make test`.
.PHONY: install install-test train rlaif test test-fast lint
install:
	@bash scripts/install.sh train
install-test:
	@bash scripts/install.sh train test
train: install
	.venv/bin/python -m recipes.xtr_lora
rlaif: install
	.venv/bin/python -m recipes.rlaif_qwen
test: install-test
	.venv/bin/python -m pytest -q
test-fast: install-test
	.venv/bin/python -m pytest -q -m fast
lint:
	@bash scripts/install.sh lint
	.venv/bin/ruff check .
