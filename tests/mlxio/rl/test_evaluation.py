"""The RLAIF recipe's problems (mlxio.rl.evaluation): the sets `DataConfig` gives
(procedural, HumanEval, transfer) and its checks naming the field."""

import attrs
import pytest

from mlxcore.rl import tasks
from mlxio.errors import ConfigError
from mlxio.rl.evaluation import DataConfig, load_problems, validate_data
from recipes import rlaif_qwen as rq  # the recipe's command line (its data checks)


def test_load_problems_sources():
    train, sets = load_problems(DataConfig(difficulty=(1, 2), train_per_template=2,
                                           heldout_per_template=1))
    assert len(train) == 4 * 3 * 2 * 2 and list(sets) == ["heldout", "heldout_families"]
    assert len(sets["heldout"]) == 4 * 3 * 2 and len(sets["heldout_families"]) == 3 * 2
    assert {tasks.task_set_of(p.task_id) for p in train} == {"train"}
    assert {p.task_id.split("/")[2] for p in sets["heldout_families"]} == {"parsing"}
    train, sets = load_problems(DataConfig(source="humaneval"))
    assert list(sets) == ["heldout"] and len(train) + len(sets["heldout"]) == 164
    train, sets = load_problems(DataConfig(max_train=5, heldout_families=(), transfer=("humaneval",)))
    assert len(train) == 5 and list(sets) == ["heldout", "humaneval"]
    assert all(p.task_id.startswith("HumanEval/") for p in sets["humaneval"])
    _, sets = load_problems(DataConfig(max_train=5, heldout_families=(), transfer=("humaneval_all",)))
    assert len(sets["humaneval"]) == 164  # the procedural tasks never train on HumanEval: all of it is held out


@pytest.mark.parametrize("change,field", [
    ({"source": "humaneva"}, "data.source"),
    ({"families": ("strings", "graphs")}, "data.families"),
    ({"families": ()}, "data.families"),
    ({"families": ("lists", "lists")}, "data.families"),
    ({"heldout_families": ("lists",)}, "data.heldout_families"),
    ({"difficulty": (0,)}, "data.difficulty"),
    ({"difficulty": ()}, "data.difficulty"),
    ({"train_per_template": 0}, "data.train_per_template"),
    ({"heldout_per_template": 0}, "data.heldout_per_template"),
    ({"task_seed": -1}, "data.task_seed"),
    ({"max_train": -2}, "data.max_train"),
    ({"heldout_fraction": 1.5}, "data.heldout_fraction"),
    ({"transfer": ("mbpp",)}, "data.transfer"),
    ({"transfer": ("humaneval", "humaneval_all")}, "data.transfer"),
])
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        validate_data(attrs.evolve(DataConfig(), **change))


def test_bad_source_on_the_command_line_fails_before_loading_anything():
    with pytest.raises(ConfigError, match="^data.source: must be one of procedural, humaneval"):
        rq.main(["--preset", "smoke", "--data.source", "mbpp"])
    with pytest.raises(ConfigError, match=r"^data.difficulty\[1\]: must be <= 3, got 5"):
        rq.main(["--preset", "smoke", "--data.difficulty", "1,5"])


def test_a_jsonl_file_overrides_the_procedural_selection(tmp_path):
    validate_data(DataConfig(problems=str(tmp_path / "x.jsonl"), families=("nope",)))
