"""A key the typed schema does not have is refused after composition, whatever Hydra let in:
``+key=value`` adds a key to a structured config (Hydra opens it for ``+``), and converting it to
its dataclass dropped the key without a word (``+paths.data_dir=X`` wrote to ./data). Keys of the
schema's free dicts (``callbacks.extra``, ``model.extra_config``) stay open."""

from __future__ import annotations

import pytest
from conftest import compose

from eagle3.config.errors import ConfigError
from eagle3.config.schema import run_config


@pytest.mark.parametrize(
    "override, named",
    [
        ("+paths.data_dir=/tmp/x", r"paths\.data_dir.*renamed.*paths\.datasets_dir"),
        ("+eval.enforce_eager=true", r"eval\.enforce_eager.*renamed.*engine\.enforce_eager"),
        ("+train.lrr=1", r"train\.lrr"),
        ("+foo=1", r"'foo'"),
        ("+head.x.y=2", r"head\.x"),
    ],
)
def test_a_key_the_schema_lacks_is_refused_naming_it(override, named):
    cfg = compose("extract", ["experiment=tiny_test", override])
    with pytest.raises(ConfigError, match=named):
        run_config(cfg)


def test_keys_of_the_schemas_free_dicts_are_kept():
    cfg = compose(
        "train",
        [
            "experiment=tiny_test",
            "+callbacks.extra.timer._target_=lightning.pytorch.callbacks.Timer",
            "+model.extra_config.rope_theta=10000",
            "hparams_search=optuna",
        ],
    )
    typed = run_config(cfg)
    assert typed.callbacks.extra["timer"]["_target_"] == "lightning.pytorch.callbacks.Timer"
    assert typed.model.extra_config["rope_theta"] == 10000
