"""Every option issue 35 added to the retriever recipe refuses a bad value with one line naming it,
before anything loads: dev evaluation, the cached contrastive loss, the hard-negative guard."""

from __future__ import annotations

import pytest

from mlxio.errors import ConfigError
from recipes import xtr_lora


@pytest.mark.parametrize("flags,named", [
    (["--train.dev_eval_every", "-1"], "train.dev_eval_every"),
    (["--train.grad_cache", "maybe"], "train.grad_cache"),
    (["--data.hard_negatives", "65"], "data.hard_negatives"),
    (["--data.negative_rank_max", "0"], "data.negative_rank_max"),
    (["--data.negative_rank_min", "32"], "data.negative_rank_min"),  # not below negative_rank_max (32)
    (["--data.negative_relative_margin", "1"], "data.negative_relative_margin"),
    (["--data.negative_absolute_margin", "-0.1"], "data.negative_absolute_margin"),
    (["--data.negative_miners", "bm25,dense"], "data.negative_miners"),
    (["--train.batch_order", "shuffled"], "train.batch_order"),
])
def test_bad_values_are_one_line_naming_the_option(flags, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")) as err:
        xtr_lora.parse(["--preset", "smoke", *flags])
    assert "\n" not in str(err.value)


def test_good_values_parse():
    cfg, _ = xtr_lora.parse(["--preset", "smoke", "--train.dev_eval_every", "3", "--train.grad_cache", "true",
                             "--data.hard_negatives", "2", "--data.negative_miners", "bm25,model",
                             "--data.negative_rank_min", "1", "--data.negative_relative_margin", "0.1",
                             "--data.negative_guide", "runs/first/merged"])
    assert (cfg.train.dev_eval_every, cfg.train.grad_cache, cfg.data.negative_miners) == (3, True, ("bm25", "model"))
    assert (cfg.data.negative_rank_min, cfg.data.negative_guide) == (1, "runs/first/merged")
    for order in ("length", "random", "neighbours"):
        assert xtr_lora.parse(["--preset", "smoke", "--train.batch_order", order])[0].train.batch_order == order
