"""Pretrained models in and out (issue 16): tiny random GPT-2, Llama (GQA) and BERT models saved with
``save_pretrained``, converted with ``python -m modforge.convert``, compared with Hugging Face's own forward,
cached forward and ``generate``, and exported back with ``format=hf``."""
import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from modforge.checkpoints import load_checkpoint  # noqa: E402
from modforge.convert import convert  # noqa: E402
from modforge.models.decoding import Stepper, decode  # noqa: E402

TEXT = ("the quick brown fox jumps over the lazy dog. " * 3 + "a stitch in time saves nine; "
        "all that glitters is not gold. to be or not to be, that is the question. ") * 4


def bpe_tokenizer(specials):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def wordpiece_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator([TEXT], trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    return tok


def save(model, tok, path):
    model.save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """{family: (directory, the HF model in eval mode)}: tiny, random, saved as save_pretrained writes them."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("hf")
    out = {}
    tok = bpe_tokenizer(["<|endoftext|>"])
    eot = tok.token_to_id("<|endoftext|>")
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  bos_token_id=eot, eos_token_id=eot, initializer_range=0.2)
    out["gpt2"] = (save(transformers.GPT2LMHeadModel(cfg), tok, root / "gpt2"), None)
    tok = bpe_tokenizer(["<unk>", "<s>", "</s>"])
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size() + 3, hidden_size=32, intermediate_size=80,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, bos_token_id=1, eos_token_id=2, initializer_range=0.2,
                                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    out["llama"] = (save(transformers.LlamaForCausalLM(cfg), tok, root / "llama"), None)
    tok = wordpiece_tokenizer()
    cfg = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                  initializer_range=0.2)
    out["bert"] = (save(transformers.BertForMaskedLM(cfg), tok, root / "bert"), None)
    models = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM,
              "bert": transformers.BertForMaskedLM}
    return {k: (d, models[k].from_pretrained(d).eval()) for k, (d, _) in out.items()}


@pytest.fixture(scope="module")
def converted(hf_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    return {k: convert(d, root / f"{k}.ckpt")[0] for k, (d, _) in hf_dirs.items()}


def padded_batch(tok, texts, left=True):
    rows = [tok.encode(t) for t in texts]
    T = max(map(len, rows))
    idx = torch.full((len(rows), T), tok.pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(rows):
        sl = slice(T - len(r), T) if left else slice(0, len(r))
        idx[i, sl], mask[i, sl] = torch.tensor(r), True
    return idx, mask


TEXTS = ["the quick brown fox", "to be or not to be, that is the question", "gold"]


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float64", 1e-10)])
def test_converted_model_gives_hugging_faces_logits_with_padding(hf_dirs, tmp_path, monkeypatch, family, dtype, tol):
    d, hf = hf_dirs[family]
    if family == "llama" and dtype == "float64":
        # HF's LlamaRMSNorm computes in float32 whatever the model's dtype; for the float64 comparison it computes
        # its formula in float64, as modforge's RMSNorm does (RoPE's angles stay float32 on both sides)
        from transformers.models.llama import modeling_llama

        def rms64(self, h):
            return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

        monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms64)
    path, summary = convert(d, tmp_path / "m.ckpt", dtype=dtype)
    task = load_checkpoint(str(path))
    ours = task.model
    assert next(ours.parameters()).dtype == getattr(torch, dtype)
    hf = hf.to(getattr(torch, dtype))
    causal = family != "bert"
    idx, mask = padded_batch(task.tokenizer, TEXTS, left=causal)
    with torch.no_grad():
        if causal:
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            got = ours(idx, mask=mask, positions=positions)
            want = hf(input_ids=idx, attention_mask=mask.long(), position_ids=positions).logits
        else:
            types = torch.zeros_like(idx)
            types[:, 3:] = 1  # a second segment, so token types are exercised
            got = ours(idx, mask=mask, token_types=types)
            want = hf(input_ids=idx, attention_mask=mask.long(), token_type_ids=types).logits
    assert got.dtype == want.dtype == getattr(torch, dtype)
    diff = (got - want).abs()[mask].max().item()
    assert diff <= tol, f"{family} {dtype}: max |logit difference| {diff:.2e} at real tokens"
    hf.float()


def padded_logits_gap(task, hf) -> float:
    """Max |ours - HF's| logit at the real tokens of a left-padded batch of :data:`TEXTS`."""
    idx, mask = padded_batch(task.tokenizer, TEXTS)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        got = task.model(idx, mask=mask, positions=positions)
        want = hf(input_ids=idx, attention_mask=mask.long(), position_ids=positions).logits
    return float((got - want).abs()[mask].max())


def cached_decoding_matches(hf, model, idx, mask, steps=5) -> Stepper:
    """Our cached greedy decoding of a left-padded batch, step by step, against HF's forward with its cache."""
    stepper = Stepper(model, idx, prefix_mask=mask)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        out = hf(input_ids=idx, attention_mask=mask.long(), position_ids=positions, use_cache=True)
        ours = stepper.start()
        torch.testing.assert_close(ours, out.logits[:, -1], rtol=0, atol=1e-5)
        past, am, pos = out.past_key_values, mask.long(), positions[:, -1:]
        for step in range(steps):
            nxt = ours.argmax(-1)
            am, pos = torch.cat([am, am.new_ones(len(am), 1)], 1), pos + 1
            out = hf(input_ids=nxt[:, None], attention_mask=am, position_ids=pos, past_key_values=past, use_cache=True)
            past = out.past_key_values
            ours = stepper.step(nxt)
            torch.testing.assert_close(ours, out.logits[:, -1], rtol=0, atol=1e-5, msg=f"step {step}")
    return stepper


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cached_decoding_equals_hugging_faces_cached_forward(hf_dirs, converted, family):
    _, hf = hf_dirs[family]
    task = load_checkpoint(str(converted[family]))
    cached_decoding_matches(hf, task.model, *padded_batch(task.tokenizer, TEXTS))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_decoding_is_generates_and_a_left_padded_batch_decodes_as_each_row_alone(hf_dirs, converted, family):
    _, hf = hf_dirs[family]
    task = load_checkpoint(str(converted[family]))
    tok = task.tokenizer
    idx, mask = padded_batch(tok, TEXTS)
    with torch.no_grad():
        ours = decode(Stepper(task.model, idx, prefix_mask=mask), 12, eos_id=tok.eos_id, pad_id=tok.pad_id)
        theirs = hf.generate(idx, attention_mask=mask.long(), max_new_tokens=12, do_sample=False,
                             eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)[:, idx.shape[1]:]
        n = max(ours.shape[1], theirs.shape[1])
        pad = lambda t: torch.cat([t, t.new_full((len(t), n - t.shape[1]), tok.pad_id)], 1)  # noqa: E731
        assert torch.equal(pad(ours), pad(theirs))
        for i, text in enumerate(TEXTS):  # each row alone, unpadded
            alone = decode(Stepper(task.model, torch.tensor([tok.encode(text)])), 12, eos_id=tok.eos_id,
                           pad_id=tok.pad_id)
            assert torch.equal(pad(alone)[0], pad(ours)[i]), text
        # and the uncached path, which recomputes every step, decodes the same
        plain = decode(Stepper(task.model, idx, prefix_mask=mask, use_cache=False), 12, eos_id=tok.eos_id,
                       pad_id=tok.pad_id)
        assert torch.equal(pad(plain), pad(ours))


def test_conversion_maps_the_families_onto_components(converted):
    llama = load_checkpoint(str(converted["llama"]))
    cfg = llama.run_cfg
    assert cfg["attention"]["name"] == "gqa" and cfg["attention"]["n_kv_heads"] == 2
    assert cfg["pos"] | {} == cfg["pos"] and cfg["pos"]["pairing"] == "half" and cfg["pos"]["angles"] == "float32"
    assert llama.model.vocab_size == llama.tokenizer.vocab_size == llama.tokenizer.hf.get_vocab_size() + 3
    assert llama.model.decoder.blocks[0].self_attn.qkv.weight.shape == (32 + 2 * 2 * 8, 32)
    bert = load_checkpoint(str(converted["bert"]))
    assert bert.run_cfg["residual"]["name"] == "post" and bert.run_cfg["task"]["name"] == "masked_lm"
    assert bert.tokenizer.mask_id == bert.tokenizer.hf.token_to_id("[MASK]")
    gpt2 = load_checkpoint(str(converted["gpt2"]))
    eot = gpt2.tokenizer.hf.token_to_id("<|endoftext|>")
    assert gpt2.tokenizer.eos_id == gpt2.tokenizer.bos_id == gpt2.tokenizer.pad_id == eot  # GPT-2 has no pad
    assert gpt2.tokenizer.decode(gpt2.tokenizer.encode("the quick fox")) == "the quick fox"


def test_conversion_to_bfloat16_builds_the_model_in_bfloat16(hf_dirs, converted, tmp_path):
    path, _ = convert(hf_dirs["llama"][0], tmp_path / "bf16.ckpt", dtype="bfloat16")
    task, full = load_checkpoint(str(path)), load_checkpoint(str(converted["llama"]))
    assert {t.dtype for t in [*task.model.parameters(), *task.model.buffers()] if t.is_floating_point()} == {
        torch.bfloat16}  # the RoPE tables too
    idx = torch.tensor([full.tokenizer.encode("the quick brown fox")])
    with torch.no_grad():
        a, b = task.model(idx).float(), full.model(idx)
    assert 0 < (a - b).abs().max() < 0.05 * b.abs().max()  # bfloat16's rounding, no more


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_export_to_hugging_face_loads_and_gives_the_same_logits(hf_dirs, converted, tmp_path, family):
    from modforge.export import main as export_main

    _, hf = hf_dirs[family]
    export_main([f"ckpt={converted[family]}", f"out={tmp_path / 'hf'}", "format=hf"])
    back = type(hf).from_pretrained(tmp_path / "hf").eval()
    task = load_checkpoint(str(converted[family]))
    idx, mask = padded_batch(task.tokenizer, TEXTS)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        want = task.model(idx, mask=mask, positions=positions)
        got = back(input_ids=idx, attention_mask=mask.long(), position_ids=positions).logits
    assert (got - want).abs()[mask].max().item() <= 1e-5
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == family


def test_refusals_are_one_line(hf_dirs, converted, tmp_path, capsys):
    from modforge.convert import main as convert_main
    from modforge.export import main as export_main

    with pytest.raises(SystemExit):
        export_main([f"ckpt={converted['bert']}", f"out={tmp_path / 'x'}", "format=hf"])
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "neither GPT-2" in err and "model=encoder_only" in err
    d = tmp_path / "odd"
    d.mkdir()
    cfg = json.loads((hf_dirs["gpt2"][0] / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "t5", "architectures": ["T5Model"]}))
    with pytest.raises(SystemExit):
        convert_main([f"hf={d}", f"out={tmp_path / 'o.ckpt'}"])
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model_type='t5'" in err and "gpt2, llama, mistral, bert" in err
    (d / "config.json").write_text(json.dumps({**cfg, "scale_attn_by_inverse_layer_idx": True}))
    with pytest.raises(SystemExit):
        convert_main([f"hf={d}", f"out={tmp_path / 'o.ckpt'}"])
    assert "scale_attn_by_inverse_layer_idx=True is not supported" in capsys.readouterr().err


def test_init_from_with_swapped_parts_loads_what_matches_and_trains(converted, tmp_path, capsys):
    from modforge.train import main

    ckpt = torch.load(converted["gpt2"], weights_only=True)
    main([f"init_from={converted['gpt2']}", "norm=rms", "ffn=swiglu", "data.block_size=32", "data.max_chars=20000",
          "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "data.batch_size=4",
          f"hydra.run.dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["status"] == "finished" and m["config"]["norm"] == "rms" and m["config"]["ffn"] == "swiglu"
    init = m["init_from"]
    layers = range(2)
    norms = [f"decoder.blocks.{i}.{r}.norm" for i in layers for r in ("r_self", "r_ffn")] + ["decoder.final_norm"]
    assert sorted(init["new"]) == sorted([f"decoder.blocks.{i}.ffn.w_gate_up.weight" for i in layers]
                                         + [f"decoder.blocks.{i}.ffn.w2.weight" for i in layers])
    assert init["reshaped"] == [f"decoder.blocks.{i}.ffn.w2.weight" for i in layers]  # SwiGLU's narrower hidden
    assert sorted(init["dropped"]) == sorted(
        [n + ".bias" for n in norms]  # RMSNorm has no bias
        + [f"decoder.blocks.{i}.ffn.{w}" for i in layers for w in ("w1.weight", "w1.bias", "w2.weight", "w2.bias")])
    assert {n + ".weight" for n in norms} <= set(init["loaded"])  # gamma kept: same name, same shape
    assert "tok.weight" in init["loaded"] and "embed.pos.table.weight" in init["loaded"]
    assert f"loaded {len(init['loaded'])} of the model's {len(init['loaded']) + len(init['new'])} tensors" in out
    # the architecture is the checkpoint's (d_model 32, 2 layers, learned positions, its tokenizer), not the defaults
    task = load_checkpoint(m["checkpoint"])
    assert task.model.cfg.d_model == 32 and task.model.cfg.n_layers == 2 and task.run_cfg["pos"]["name"] == "learned"
    assert task.tokenizer.name == "pretrained" and task.model.vocab_size == ckpt["state_dict"]["model.tok.weight"].shape[0]
    # a converted checkpoint is not a run to resume
    with pytest.raises(SystemExit):
        main([f"resume={converted['gpt2']}", f"hydra.run.dir={tmp_path / 'r2'}"])
    assert "fine-tune from it with init_from=" in capsys.readouterr().err


def test_the_command_line_check_builds_on_the_init_from_architecture(converted, tmp_path):
    """BERT's checkpoint is an encoder: ``task=classify`` fits it, though the default model (decoder_only) would
    not; the check before any work composes what the run will (it once checked the defaults and refused)."""
    from modforge.registry import ConfigError
    from modforge.cli.preflight import preflight

    data = tmp_path / "cls.csv"
    data.write_text("text,label\n" + "".join(f"the quick fox {i},{'ab'[i % 2]}\n" for i in range(20)))
    ok = [f"init_from={converted['bert']}", "task=classify", "data=classify", f"data.path={data}", "data.max_len=32"]
    assert preflight(ok, False).jobs == 1
    with pytest.raises(ConfigError, match="model.max_len=64 is shorter"):  # the checkpoint's max_len, 64
        preflight(ok[:-1] + ["data.max_len=100"], False)


def test_mistral_converts_as_llama_with_its_head_dim_and_its_sliding_window(tmp_path):
    """A Mistral checkpoint (one key/value head, head_dim 16 apart from d_model / n_heads = 8) gives HF's
    logits on a left-padded batch; v0.1's sliding window shorter than the positions converts as attention.window
    (its logits against HF's: tests/test_modern_variants.py)."""
    torch.manual_seed(0)
    tok = bpe_tokenizer(["<unk>", "<s>", "</s>"])
    kw = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
              bos_token_id=1, eos_token_id=2, initializer_range=0.2)
    hf = transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=None, **kw)).eval()
    path, summary = convert(save(hf, tok, tmp_path / "mistral"), tmp_path / "m.ckpt")
    assert "model.head_dim=16" in summary["overrides"] and "attention.n_kv_heads=1" in summary["overrides"]
    task = load_checkpoint(str(path))
    assert padded_logits_gap(task, hf) < 1e-5
    v01 = save(transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=16, **kw)), tok,
               tmp_path / "v01")
    assert "attention.window=16" in convert(v01, tmp_path / "o.ckpt")[1]["overrides"]


def test_convert_refuses_damaged_directories_in_one_line_and_never_writes_over_its_input(hf_dirs, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from modforge.convert import main as convert_main

    def refused(d, out, match):
        with pytest.raises(SystemExit) as e:
            convert_main([f"hf={d}", f"out={out}"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and match in err, err

    src = hf_dirs["gpt2"][0]
    d = tmp_path / "gpt2"
    shutil.copytree(src, d)
    before = (d / "model.safetensors").read_bytes()
    refused(d, d / "model.safetensors", "that is a file conversion reads (model.safetensors")
    assert (d / "model.safetensors").read_bytes() == before
    (d / "model.safetensors").write_bytes(before[: len(before) // 2])  # an interrupted download
    refused(d, tmp_path / "o.ckpt", "not a readable safetensors file")
    state = load_file(str(src / "model.safetensors"))
    name = next(k for k, v in state.items() if v.dim() == 2)
    state[name] = torch.zeros(3, 5)
    save_file(state, str(d / "model.safetensors"))
    refused(d, tmp_path / "o.ckpt", "the weights do not fit the model config.json describes")
    shutil.copy(src / "model.safetensors", d / "model.safetensors")
    (d / "tokenizer.json").write_text("{not json")
    refused(d, tmp_path / "o.ckpt", "tokenizer=" + str(d / "tokenizer.json") + ": not valid JSON")
    shutil.copy(src / "tokenizer.json", d / "tokenizer.json")
    (d / "model.safetensors.index.json").write_text("[")
    refused(d, tmp_path / "o.ckpt", "model.safetensors.index.json: not valid JSON")
    (d / "model.safetensors.index.json").unlink()
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "modeling_x.X"}}))
    convert_main([f"hf={d}", f"out={tmp_path / 'ok.ckpt'}"])
    assert "note: config.json names custom code (auto_map: AutoModel); it is never run" in capsys.readouterr().out


def test_convert_refuses_a_vocab_size_that_is_no_number_and_weights_that_are_not_finite(hf_dirs, tmp_path, capsys):
    """config.json's vocab_size 'abc', a model.safetensors of NaN, weights beyond float16's range converted with
    dtype=float16: each one line naming it, and no checkpoint written."""
    from safetensors.torch import load_file, save_file

    from modforge.convert import main as convert_main

    src = hf_dirs["gpt2"][0]
    d = tmp_path / "gpt2"
    shutil.copytree(src, d)
    cfg = json.loads((src / "config.json").read_text())

    def refused(match, *extra):
        with pytest.raises(SystemExit) as e:
            convert_main([f"hf={d}", f"out={tmp_path / 'o.ckpt'}", *extra])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and match in err, err
        assert not (tmp_path / "o.ckpt").exists()

    (d / "config.json").write_text(json.dumps({**cfg, "vocab_size": "abc"}))
    refused(f"hf={d / 'config.json'}: vocab_size='abc': must be a whole number")
    (d / "config.json").write_text(json.dumps(cfg))
    state = load_file(str(src / "model.safetensors"))
    save_file({k: torch.full_like(v, float("nan")) for k, v in state.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    refused("holds non-finite values (NaN or inf) as float32; nothing written")
    name = next(k for k, v in state.items() if k.endswith("mlp.c_fc.weight"))
    save_file({**state, name: state[name] * 1e6}, str(d / "model.safetensors"), metadata={"format": "pt"})
    convert_main([f"hf={d}", f"out={tmp_path / 'f32.ckpt'}"])  # finite in float32
    refused("(modforge's name) holds non-finite values (NaN or inf) as float16", "dtype=float16")
