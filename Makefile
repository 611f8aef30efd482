# Two commands on a fresh machine: `make train` (the main job on the embedded default) and
# `make test` (the test suite). Both create .venv and install everything on first use.
.PHONY: install train rlaif test lint bench
install:
	@bash scripts/install.sh
train: install
	.venv/bin/python -m recipes.xtr_lora
rlaif: install
	.venv/bin/python -m recipes.rlaif_qwen
test: install
	.venv/bin/python -m pytest -q
lint: install
	.venv/bin/ruff check .
