import pytest

from modforge.config import compose
from modforge.registry import UnknownComponentError


def test_default_composition_chains_model_task_data():
    cfg = compose([])
    assert (cfg.model.name, cfg.task.name, cfg.data.name) == ("decoder_only", "causal_lm", "stdlib")
    for group, name in [("norm", "layer"), ("residual", "pre"), ("ffn", "gelu"), ("pos", "learned"),
                        ("optim", "adamw"), ("scheduler", "cosine")]:
        assert cfg[group].name == name


@pytest.mark.parametrize("model,task,data", [("encoder_only", "masked_lm", "stdlib"),
                                             ("encoder_decoder", "seq2seq", "reverse")])
def test_model_selects_its_default_task_and_data(model, task, data):
    cfg = compose([f"model={model}"])
    assert (cfg.task.name, cfg.data.name) == (task, data)


def test_overrides_reach_every_level():
    cfg = compose(["model=encoder_decoder", "data=sort", "model.n_layers=3", "norm=rms", "norm.eps=1e-5",
                   "trainer.max_steps=7", "seed=3"])
    assert cfg.data.name == "sort" and cfg.model.n_layers == 3 and cfg.norm.eps == 1e-5
    assert cfg.trainer.max_steps == 7 and cfg.seed == 3


def test_wrong_type_fails_at_compose_time_in_one_line():
    from modforge.registry import ConfigError

    with pytest.raises(ConfigError, match="model.d_model=big.*could not be converted to Integer") as e:
        compose(["model.d_model=big"])
    assert "\n" not in str(e.value)


def test_unknown_option_fails_before_composition():
    with pytest.raises(UnknownComponentError, match="Did you mean 'encoder_only'"):
        compose(["model=encoder_onyl"])


def test_any_trainer_argument_is_a_key_and_typos_suggest():
    from modforge.registry import ConfigError

    cfg = compose(["trainer.accumulate_grad_batches=2", "trainer.enable_progress_bar=false", "trainer=gpu"])
    assert cfg.trainer.accumulate_grad_batches == 2 and cfg.trainer.enable_progress_bar is False
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.max_steps == 2000  # gpu inherits cpu's settings
    with pytest.raises(ConfigError, match="trainer.acumulate_grad_batches.*Did you mean 'accumulate_grad_batches'"):
        compose(["trainer.acumulate_grad_batches=2"])
    with pytest.raises(ConfigError, match="trainer.logger: choose loggers with logger="):
        compose(["trainer.logger=false"])
    with pytest.raises(ConfigError, match="set by modforge"):
        compose(["trainer.default_root_dir=x"])
