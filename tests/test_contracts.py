"""Tests driven by the registry: every kind's contract, for every registered variant (built-ins, installed
plugins' and test components alike), and the guarantee that no built-in variant lacks a reference test and
no README row disagrees with the registry."""
import importlib
import re
from pathlib import Path

import pytest
import torch

from modforge import registry
from modforge.models.blocks import Parts
from modforge.registry import build

README = Path(__file__).resolve().parent.parent / "README.md"

# Each built-in variant, and the test that checks it against an independent reference (torch's own module,
# a formula of the reference documents or a paper, or a property). A new built-in fails
# test_every_builtin_variant_has_a_reference_test until it is named here with its test.
REFERENCE_TESTS = {
    "norm": {"layer": "test_norms::test_layer_matches_torch",
             "rms": "test_norms::test_rms_inside_matches_torch_rmsnorm",
             "batch": "test_norms::test_batch_matches_batchnorm1d_on_unpadded_tokens",
             "batch_causal": "test_norms::test_causal_batch_norm_sees_no_later_token_and_matches_batch_norm_at_the_last_position"},
    "residual": {"post": "test_models::test_block_matches_torch_encoder_layer",
                 "pre": "test_models::test_block_matches_torch_encoder_layer",
                 "sandwich": "test_modern_variants::test_converted_model_gives_hugging_faces_logits_on_a_left_padded_batch",
                 "reordered": "test_modern_variants::test_converted_model_gives_hugging_faces_logits_on_a_left_padded_batch",
                 "parallel": "test_modern_variants::test_converted_gptj_gives_hugging_faces_logits_and_decodes_as_its_cache_does"},
    "logits": {"plain": "test_modern_variants::test_soft_capped_logits_match_the_formula_and_stay_inside_the_cap",
               "softcap": "test_modern_variants::test_converted_model_gives_hugging_faces_logits_on_a_left_padded_batch"},
    "activation": {n: "test_activations_ffn::test_activation_matches_formula"
                   for n in ("relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "leaky_relu")},
    "ffn": {**{n: "test_activations_ffn::test_mlp_ffn_formula" for n in ("relu", "gelu", "mlp")},
            **{n: "test_activations_ffn::test_gated_ffn_formula" for n in ("glu", "reglu", "swiglu", "geglu")},
            "moe": "test_modern_variants::test_moe_block_equals_mixtrals_sparse_block_and_its_balancing_loss"},
    "pos": {"sinusoidal": "test_positions::test_sinusoidal_matches_paper_formula",
            "learned": "test_positions::test_learned_positions_are_trained_parameters",
            "rope": "test_positions::test_rope_interleaved_matches_reference_code",
            "none": "test_positions::test_none_is_identity"},
    "attention": {"mha": "test_attention::test_self_attention_matches_naive",
                  "gqa": "test_attention::test_grouped_query_attention_matches_per_head_reference",
                  "mqa": "test_attention::test_grouped_query_attention_matches_per_head_reference",
                  "diff": "test_modern_variants::test_differential_attention_matches_the_papers_formula_head_by_head",
                  "mla": "test_modern_variants::test_latent_attention_equals_deepseek_v3s_attention_with_copied_weights"},
    "model": {"decoder_only": "test_models::test_decoder_is_causal",
              "encoder_only": "test_models::test_padding_does_not_change_real_outputs",
              "encoder_decoder": "test_models::test_encoder_decoder_decoder_is_causal"},
    "tokenizer": {"char": "test_tokenizers::test_char_ids_are_unchanged_and_round_trip_exactly",
                  "byte": "test_tokenizers::test_byte_round_trips_any_text_exactly",
                  "bpe": "test_tokenizers::test_bpe_reserves_our_specials_at_0_to_4_and_round_trips_its_training_text",
                  "pretrained": "test_pretrained::test_conversion_maps_the_families_onto_components"},
    "optim": {"adam": "test_optim::test_adam_is_torchs_adam_with_the_configured_betas",
              "adamw": "test_optim::test_adamw_decays_matrices_only_unless_asked",
              "muon": "test_modern_variants::test_muon_is_torchs_muon_on_the_blocks_matrices_and_adamw_on_the_rest_and_its_state_restores_exactly"},
    "scheduler": {"noam": "test_optim::test_noam_is_the_papers_formula_counting_steps_from_one",
                  "cosine": "test_optim::test_cosine_warms_up_linearly_then_decays_to_its_floor",
                  "constant": "test_optim::test_constant_after_its_warm_up",
                  "wsd": "test_modern_variants::test_wsd_is_warmup_stable_then_the_papers_cooldown_and_budgets_share_their_run_up_to_the_decay"},
    "param": {"standard": "test_mup::test_mup_at_its_base_shape_computes_what_standard_does",
              "mup": "test_mup::test_coordinate_check_flat_under_mup_growing_under_standard",
              "umup": "test_umup::test_stored_at_mups_scale_it_trains_as_the_literal_unit_scaled_model"},
    "task": {"causal_lm": "test_train::test_run_writes_metrics_config_and_a_rebuildable_checkpoint",
             "masked_lm": "test_train::test_cli_trains_and_learns",
             "seq2seq": "test_data::test_seq2seq_trains_on_parallel_text",
             "seq2seq_lm": "test_tasks::test_seq2seq_lm_reads_source_bos_target_and_learns_the_target_only",
             "transduce": "test_tasks::test_transduce_predicts_the_target_at_each_source_position",
             "classify": "test_data::test_classify_trains_and_its_checkpoint_keeps_the_labels"},
    "data": {"stdlib": "test_data::test_stdlib_keeps_its_text_split_and_ids",
             "tokens": "test_tokens_data::test_prepare_writes_whole_documents_with_end_marks_and_the_same_bytes_with_any_number_of_workers",
             "tinyshakespeare": "test_data::test_tinyshakespeare_local_copy_is_the_standard_split",
             "text": "test_data::test_text_reads_files_and_globs_in_order",
             "hf": "test_data::test_hf_reads_a_datasets_split_by_field",
             "classify": "test_data::test_classify_reads_csv_and_jsonl_alike",
             "parallel": "test_data::test_parallel_tsv_and_aligned_files_give_the_same_batches",
             "reverse": "test_train::test_cli_trains_and_learns",
             "sort": "test_data::test_synthetic_targets_are_reversed_and_sorted_digits"},
}


def builtin_names(kind: str) -> set[str]:
    return {e.name for e in registry.registry(kind).entries() if e.provider == registry.BUILTIN}


BUILTIN_KINDS = [k for k in registry.kinds() if registry.kind(k).provider == registry.BUILTIN]


def test_every_builtin_kind_is_covered_by_the_reference_table():
    assert set(REFERENCE_TESTS) == set(BUILTIN_KINDS)


@pytest.mark.parametrize("kind", BUILTIN_KINDS)
def test_every_builtin_variant_has_a_reference_test(kind):
    named = REFERENCE_TESTS.get(kind, {})
    missing = builtin_names(kind) - set(named)
    assert not missing, f"built-in {kind} variants with no reference test: {sorted(missing)}; add one to REFERENCE_TESTS"
    assert set(named) <= builtin_names(kind), f"REFERENCE_TESTS names {kind} variants that do not exist"
    for ref in set(named.values()):
        module, func = ref.split("::")
        assert callable(getattr(importlib.import_module(module), func, None)), f"{ref}: no such test"


def registered(kind):
    return registry.registry(kind).names()


# --------------------------------------------------------------------------- contracts, every registered variant

@pytest.mark.parametrize("kind", ["norm", "ffn", "attention", "pos", "residual", "model", "task", "data", "tokenizer",
                                  "activation"])
def test_declared_bases_are_enforced_for_every_kind_users_extend(kind):
    base = registry.registry(kind).base  # (the table names it; the registry imports it)
    assert base is not None
    with pytest.raises(registry.ModforgeError, match=f"must subclass {base.__module__}.{base.__qualname__}"):
        registry.register(kind, "test_not_a_subclass")(type("NotASubclass", (torch.nn.Module,), {}))
    assert "test_not_a_subclass" not in registry.registry(kind)


@pytest.mark.parametrize("name", registered("norm"))
def test_norm_contract(name):
    """(B, T, C) in, same shape out; padded positions never change real tokens' outputs (training mode)."""
    norm = build("norm", name, 8).train()
    x = torch.randn(3, 5, 8)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    garbage = x.clone()
    garbage[~mask] = 1e3 * torch.randn_like(garbage[~mask])
    a, b = norm(x, mask), norm(garbage, mask)
    assert a.shape == x.shape and torch.isfinite(a).all()
    torch.testing.assert_close(a[mask], b[mask])


@pytest.mark.parametrize("name", registered("activation"))
def test_activation_is_elementwise(name):
    act = build("activation", name)
    x = torch.randn(4, 6)
    perm = torch.randperm(x.numel())
    torch.testing.assert_close(act(x.flatten()[perm]), act(x).flatten()[perm])


@pytest.mark.parametrize("name", registered("ffn"))
def test_ffn_is_position_wise(name):
    ffn = build("ffn", name, 8, 32)
    assert ffn.hidden >= 1
    x = torch.randn(2, 5, 8)
    perm = torch.randperm(5)
    torch.testing.assert_close(ffn(x[:, perm]), ffn(x)[:, perm])


@pytest.mark.parametrize("name", registered("pos"))
def test_positional_hooks_keep_shapes(name):
    pos = build("pos", name, 8, 2, 16)
    x, t = torch.randn(2, 5, 8), torch.randn(2, 2, 5, 4)
    assert pos.embed(x, 3).shape == x.shape and pos.rotate(t, 3).shape == t.shape
    bias = pos.attn_bias(5, 8, 3)
    assert bias is None or bias.shape[-2:] == (5, 8)


@pytest.mark.parametrize("name", registered("attention"))
def test_attention_owns_its_cache(name):
    """Cached decoding, token by token, equals the full causal pass; the cache comes from the attention."""
    attn = build("attention", name, 8, 2).eval()
    x = torch.randn(2, 6, 8)
    cache = attn.new_cache(6)
    assert callable(getattr(cache, "reorder", None))
    with torch.no_grad():
        full = attn(x, causal=True)
        steps = torch.cat([attn(x[:, i:i + 1], causal=True, cache=cache) for i in range(6)], 1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", registered("model"))
def test_model_capabilities_are_what_it_can_do(name):
    m = build("model", {"name": name, "d_model": 16, "n_heads": 2, "n_layers": 1, "max_len": 16}, Parts(), 11).eval()
    x = torch.randint(5, 11, (2, 6))
    if m.has_encoder:
        assert m.encode(x).shape == (2, 6, 16)
    else:
        with pytest.raises(NotImplementedError):
            m.encode(x)
    if m.can_generate:
        assert len(m.new_cache(8)) >= 1


# --------------------------------------------------------------------------- declarations

def test_parts_and_primary_defaults_derive_from_the_declarations():
    assert set(registry.part_kinds()) >= {"norm", "residual", "ffn", "pos", "attention"}
    assert Parts(ffn="swiglu").norm == "layer" and Parts(ffn="swiglu").ffn == "swiglu"
    with pytest.raises(registry.ConfigError, match="Did you mean 'norm'"):
        Parts(nrom="rms")
    defaults = registry.defaults_list()
    assert {"norm": "layer"} in defaults and {"model": "decoder_only"} in defaults
    assert all(registry.kind(k).top_level for d in defaults for k in d)
    from modforge.config import compose

    cfg = compose([])
    for d in defaults:
        (kind, option), = d.items()
        assert cfg[kind].name == option


def test_nested_kinds_are_not_config_groups():
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for kind in registry.kinds():
        assert (kind in repo) == registry.kind(kind).top_level, kind


def test_a_new_kind_is_one_declaration_plus_its_classes():
    """Declaring a part kind with a default makes it a field of Parts, a config group and a default of the
    primary config, with no other edit; a component of it then builds through the registry."""
    from hydra.core.config_store import ConfigStore

    from modforge.config import compose

    class Gate(torch.nn.Module):
        pass

    try:
        registry.declare("test_gate", "a throwaway kind", base=Gate, default="open", part=True)

        @registry.register("test_gate", "open")
        class Open(Gate):
            def __init__(self, cfg, d_model):
                super().__init__()

        assert Parts().test_gate == "open" and Parts(test_gate="open").test_gate == "open"
        cfg = compose(["test_gate=open"])
        assert cfg.test_gate.name == "open"
        assert isinstance(build("test_gate", cfg.test_gate, 8), Open)
        with pytest.raises(registry.ModforgeError, match="must subclass"):
            registry.register("test_gate", "closed")(type("Closed", (torch.nn.Module,), {}))
        with pytest.raises(registry.ModforgeError, match="needs a default"):
            registry.declare("test_gate_without_default", "no default", part=True)
    finally:
        registry.forget_kind("test_gate")
    assert "test_gate" not in registry.part_kinds() and "test_gate" not in ConfigStore.instance().repo
    assert "test_gate" not in str(compose([]))


# --------------------------------------------------------------------------- docs

def readme_table() -> dict[str, tuple[list[str], str]]:
    """{group: ([option names], default)} from the README's vocabulary table."""
    rows = {}
    text = README.read_text(encoding="utf-8")
    table = text[text.index("| group | options | what it selects |"):]
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`([a-z0-9_]+)`", cells[1])
        default = re.search(r"`([a-z0-9_]+)` \(default\)", cells[1])
        rows[re.match(r"`?([a-z_]+)", cells[0]).group(1)] = (names, default.group(1) if default else None)
    return rows


def test_readme_vocabulary_table_agrees_with_the_registry():
    from modforge.config.composition import preset_options

    table = readme_table()
    assert set(table) == set(BUILTIN_KINDS) | {"trainer", "callbacks", "logger"}, \
        "one README row per kind, plus the YAML groups trainer, callbacks and logger"
    for kind in BUILTIN_KINDS:
        names, default = table[kind]
        assert set(names) == builtin_names(kind), f"README row of {kind}: {sorted(names)} vs {sorted(builtin_names(kind))}"
        assert default == registry.kind(kind).default, f"README default of {kind}"
    for group in ("trainer", "callbacks", "logger"):
        assert set(table[group][0]) == set(preset_options(group)), f"README row of {group}"
        assert table[group][1] == {"trainer": "cpu", "callbacks": "default", "logger": "csv"}[group]
