from dataclasses import dataclass

import pytest
import torch
from torch import nn

from modforge import registry
from modforge.config.command_line import check_overrides
from modforge.config import compose
from modforge.components.norms import Norm
from modforge.models.blocks import Parts
from modforge.registry import (AmbiguousComponentError, ConfigError, DuplicateComponentError, UnknownComponentError,
                               build, register)


@register("norm", "test_halfnorm")
class HalfNorm(Norm):
    """A norm defined in a test file: x * scale."""

    @dataclass
    class Config:
        scale: float = 0.5

    def __init__(self, cfg: Config, d_model: int):
        super().__init__()
        self.scale = cfg.scale
        self.w = nn.Parameter(torch.ones(d_model))

    def forward(self, x, mask=None):
        return x * self.scale * self.w


def test_unknown_name_lists_options_and_suggests_close_match():
    with pytest.raises(UnknownComponentError) as e:
        build("norm", "rmss", 8)
    msg = str(e.value)
    assert "Unknown norm 'rmss'" in msg and "Did you mean 'rms'" in msg
    for name in ("layer", "batch", "rms"):
        assert name in msg
    assert "built-in" in msg


def test_unknown_key_names_key_and_allowed_keys():
    with pytest.raises(ConfigError, match=r"norm.epz.*Did you mean 'eps'.*Allowed keys: eps, bias"):
        build("norm", {"name": "layer", "epz": 1e-3}, 8)


def test_duplicate_registration_names_both_providers():
    with pytest.raises(DuplicateComponentError, match=r"registered twice.*built-in.*test_registry"):
        @register("norm", "layer")
        class Another(Norm):
            pass


def test_a_plugins_config_directory_is_recorded_once_however_it_arrives():
    """A full load records ``pkg://pkg.conf``; the cached manifest (read by the front door in the same process,
    after a load) records the directory it names. Hydra's search path and ``modforge list`` want it once."""
    label = "test-plugin 9.9"
    try:
        registry.record_config_dir(label, "pkg://test_plugin.conf")
        registry.record_config_dir(label, "/somewhere/test_plugin/conf")
        assert [d for p, d in registry.plugin_config_dirs() if p == label] == ["pkg://test_plugin.conf"]
    finally:
        registry.forget_provider(label)
    assert all(p != label for p, _ in registry.plugin_config_dirs())


def test_plugin_collisions_are_ambiguous_only_when_used():
    reg = registry.Registry(registry.Kind("norm", "a registry of its own"))
    for prov in ("pkg-a 1.0", "pkg-b 2.0"):
        with registry.provider(prov):
            reg.add(registry.Entry("norm", "fancy", type(prov, (), {}), registry._EmptyConfig, prov),
                    allow_ambiguous=True)
    with pytest.raises(AmbiguousComponentError, match=r"pkg-a 1.0.*pkg-b 2.0"):
        reg.get("fancy")


def test_registered_class_is_a_command_line_option_with_no_yaml():
    cfg = compose(["norm=test_halfnorm", "norm.scale=0.25"])
    assert cfg.norm.name == "test_halfnorm" and cfg.norm.scale == 0.25
    model = build("model", {"name": "decoder_only", "d_model": 16, "n_heads": 2, "n_layers": 1},
                  Parts.from_config(cfg), 11)
    assert isinstance(model.decoder.blocks[0].r_self.norm, HalfNorm)
    assert model.decoder.blocks[0].r_self.norm.scale == 0.25


def test_command_line_typo_in_option_or_key_suggests():
    with pytest.raises(UnknownComponentError, match="Did you mean 'swiglu'"):
        check_overrides(["ffn=swigl"])
    with pytest.raises(UnknownComponentError, match="Did you mean 'rope'"):
        check_overrides(["pos=sinusoidal,ropee"])  # inside a sweep too
    with pytest.raises(ConfigError, match="Did you mean 'eps'"):
        check_overrides(["norm.epss=1"])
    check_overrides(["norm=rms", "norm.eps=1e-5", "ffn=swiglu,geglu", "trainer.max_steps=3"])  # fine


def test_base_class_is_enforced():
    with pytest.raises(registry.ModforgeError, match="must subclass"):
        @register("pos", "test_not_a_scheme")
        class NotAScheme(nn.Module):
            pass


def test_list_shows_providers_and_defaults():
    from modforge.catalog import render

    out = render(["norm", "ffn"])
    assert "rms" in out and "[built-in]" in out and "eps_placement='inside'" in out
    assert "match_params=True" in out


def test_list_shows_where_each_component_lives_its_docstring_and_the_presets(capsys):
    from modforge.catalog import main

    main([])
    out = capsys.readouterr().out
    assert "modforge.components.norms.RMSNorm" in out and "base modforge.components.norms.Norm" in out
    assert "chosen with ffn.activation=NAME" in out  # a nested kind says which key selects it
    assert "experiment:" in out and "shakespeare_char" in out and "vanilla_transformer" in out
    assert "trainer:" in out and "  ddp" in out and "  lightning" not in out
    main(["norm", "rms"])
    one = capsys.readouterr().out
    assert one.startswith("norm rms  [built-in]  modforge.components.norms.RMSNorm")
    assert "reference 000 and 001" in one  # the whole docstring, not only its first line
    assert "eps_placement = 'inside'" in one


@pytest.mark.parametrize("argv,match", [(["nrom"], "Did you mean 'norm'"), (["norm", "rmss"], "Did you mean 'rms'")])
def test_list_errors_are_one_line(argv, match, capsys):
    from modforge.catalog import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and match in err and err.count("\n") == 1


@pytest.mark.parametrize("verb", ["list", "generate", "report", "export", "convert"])
def test_every_entry_point_has_help(verb, capsys):
    import importlib

    from modforge.__main__ import VERBS

    mod = importlib.import_module(VERBS[verb][0])
    mod.main(["--help"])
    out = capsys.readouterr().out
    command = "python -m modforge list" if verb == "list" else f"python -m modforge.{verb}"
    assert out.startswith(mod.__doc__.strip()) and command in out
    if verb != "list":  # and the block of options generated from the command's declarations
        assert out.strip().endswith(mod.OPTIONS.help()), out[-500:]


def test_a_number_field_given_no_number_is_refused_naming_the_key_before_the_configs_own_checks():
    """A checkpoint's config reaches make_config without Hydra's typing: 'abc' for model.d_model is one line
    naming it (not Python's "'<' not supported between 'str' and 'int'"); ints for floats and None for optional
    fields stay accepted."""
    with pytest.raises(ConfigError, match=r"^model 'decoder_only': model.d_model='abc': must be a whole number$"):
        registry.make_config("model", {"name": "decoder_only", "d_model": "abc"})
    with pytest.raises(ConfigError, match=r"model.dropout='x': must be a number$"):
        registry.make_config("model", {"name": "decoder_only", "dropout": "x"})
    assert registry.make_config("model", {"name": "decoder_only", "dropout": 0, "d_ff": None})[1].dropout == 0


def test_modforges_kinds_are_a_table_whose_order_no_import_decides():
    """registry.KINDS declares modforge's own kinds as data: they exist, in the table's order, as soon as the
    registry is imported (before any component module), and each table base names the class its options extend."""
    import importlib

    from modforge import registry as reg
    from modforge.plugins import load_all

    names = [k.name for k in reg.KINDS]
    assert reg.kinds()[: len(names)] == names
    load_all()
    for k in reg.KINDS:
        if k.base is not None:
            module, _, cls = k.base.partition(":")
            assert reg.registry(k.name).base is getattr(importlib.import_module(module), cls)
            assert all(issubclass(e.cls, reg.registry(k.name).base) for e in reg.registry(k.name).entries())
