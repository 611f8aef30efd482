"""Every recipe's --help shows its whole module docstring as written: the description, and the
example command lines one per line (argparse would otherwise wrap them into one paragraph)."""

import pytest

from recipes import code_search, rlaif_judge, rlaif_qwen, rlaif_worker, xtr_lora

RECIPES = [xtr_lora, rlaif_qwen, rlaif_judge, code_search, rlaif_worker]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda m: m.__name__)
def test_help_shows_the_whole_docstring_line_by_line(recipe, capsys):
    with pytest.raises(SystemExit) as done:
        recipe.main(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out.splitlines()
    lines = [line.rstrip() for line in recipe.__doc__.strip().splitlines()]
    at = shown.index(lines[0])
    assert shown[at:at + len(lines)] == lines
    assert any(line.lstrip().startswith("python -m ") for line in lines[1:])  # the examples are in it
