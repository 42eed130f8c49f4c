"""The pair tasks of the architectures study: seq2seq_lm (decoder-only) and transduce (encoder-only), and the
evaluation at other block lengths (eval_block_sizes) of the positions study."""
import csv
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_overrides
from modforge.config import compose
from modforge.config.composition import to_plain
from modforge.data.examples import collate_pairs
from modforge.registry import ModforgeError, build, make_config
from modforge.tasks.base import IGNORE
from modforge.run.story import run


def make_task(*overrides):
    cfg = compose(tiny_overrides() + list(overrides))
    facts = build("data", cfg.data).prepare()
    entry, task_cfg = make_config("task", cfg.task)
    return entry.cls(task_cfg, to_plain(cfg), facts).eval()


PAIRS = [([5, 6, 7], [8, 9, 10]), ([11, 12, 13, 14], [14, 13, 12, 11]), ([6, 7, 8], [8, 7, 6]), ([9, 5, 6], [6, 5, 9])]


def test_seq2seq_lm_reads_source_bos_target_and_learns_the_target_only():
    task = make_task("model=decoder_only", "task=seq2seq_lm")
    tok = task.tokenizer
    b = collate_pairs(PAIRS[:2])
    x, y, n = task.joined(b)
    P, B, E = tok.pad_id, tok.bos_id, tok.eos_id
    assert x.tolist() == [[5, 6, 7, B, 8, 9, 10, P, P], [11, 12, 13, 14, B, 14, 13, 12, 11]]
    _ = IGNORE
    assert y.tolist() == [[_, _, _, 8, 9, 10, E, _, _], [_, _, _, _, 14, 13, 12, 11, E]]
    assert n == 7 + 9
    # the loss is the cross-entropy of the target positions only, computed by hand
    logits, targets, _ = task.teacher_forced(b)
    keep = targets != IGNORE
    manual = F.cross_entropy(task.model(x)[keep], targets[keep])
    assert torch.allclose(task.xent(logits, targets, smoothing=0.0), manual)


def test_a_pad_that_is_also_bos_and_eos_masks_nothing_real():
    """GPT-2's tokenizer pads with <|endoftext|>, its <bos> and <eos>: masks come from the lengths and the
    loss ignores IGNORE, so the target's <eos> is still learnt and <bos> is still read."""
    task = make_task("model=decoder_only", "task=seq2seq_lm")
    E = 3
    task.tokenizer.pad_id = task.tokenizer.bos_id = task.tokenizer.eos_id = E
    b = collate_pairs(PAIRS[:2], pad=E, bos=E, eos=E)
    assert b["tgt_mask"].tolist() == [[True] * 4 + [False], [True] * 5] and b["tgt_in"][0, 0] == E
    assert b["src_mask"].tolist() == [[True] * 3 + [False], [True] * 4]
    x, y, _ = task.joined(b)
    assert y[0].tolist() == [IGNORE] * 3 + [8, 9, 10, E] + [IGNORE] * 2 and x[0, 3] == E
    logits, targets, _ = task.teacher_forced(b)
    keep = targets != IGNORE
    assert int(keep.sum()) == 9 and (targets[keep] == E).sum() == 2  # both <eos> targets count
    assert torch.allclose(task.xent(logits, targets, smoothing=0.0),
                          F.cross_entropy(logits[keep], targets[keep]))


def test_seq2seq_lm_decodes_each_row_as_it_would_alone():
    task = make_task("model=decoder_only", "task=seq2seq_lm")
    b = collate_pairs(PAIRS)
    together = task.predict(b)
    for i, pair in enumerate(PAIRS):
        alone = task.predict(collate_pairs([pair]))
        assert together[i, : alone.shape[1]].tolist() == alone[0].tolist()


def test_the_end_of_row_bos_is_the_prompt_a_decoder_continues():
    """The decoded answer is what greedy argmax over the full sequence gives, step by step."""
    task = make_task("model=decoder_only", "task=seq2seq_lm")
    b = collate_pairs(PAIRS[:1])
    out = task.predict(b)
    seq = torch.tensor([[5, 6, 7, task.tokenizer.bos_id]])
    for t in range(3):
        nxt = task.model(seq)[0, -1].argmax()
        assert int(out[0, t]) == int(nxt)
        seq = torch.cat([seq, nxt.view(1, 1)], 1)


def test_transduce_predicts_the_target_at_each_source_position():
    task = make_task("model=encoder_only", "task=transduce")
    b = collate_pairs(PAIRS[1:3])
    P = task.tokenizer.pad_id
    assert task.wanted(b).tolist() == [[14, 13, 12, 11], [8, 7, 6, P]]
    logits, targets, n = task.teacher_forced(b)
    assert logits.shape[:2] == targets.shape and n == 7
    right = task.predict(b)
    assert right[1, 3] == P  # nothing predicted under the padding
    with pytest.raises(ModforgeError, match="a source of 3 and a target of 2 tokens; use task=seq2seq"):
        task.wanted(collate_pairs([([5, 6, 7], [8, 9])]))


@pytest.mark.parametrize("arch", [["model=encoder_decoder", "task=seq2seq"], ["model=decoder_only", "task=seq2seq_lm"],
                                  ["model=encoder_only", "task=transduce"]])
def test_target_loss_scores_the_same_tokens_of_a_pair_for_every_architecture(arch):
    """val/target_loss leaves out <eos>, which only the generative tasks predict: each task's is the
    cross-entropy of exactly the pair's target tokens, by hand; for an encoder-only model it is its val/loss."""
    task = make_task(*arch)
    b = collate_pairs(PAIRS)
    logits, targets, _ = task.teacher_forced(b)
    content = (targets != IGNORE) & (targets != task.tokenizer.eos_id)
    assert sorted(targets[content].tolist()) == sorted(t for _, tgt in PAIRS for t in tgt)
    by_hand = F.cross_entropy(logits[content], targets[content])
    assert torch.allclose(task.target_loss(logits, targets)[0], by_hand)
    if "task=transduce" in arch:
        assert torch.allclose(task.target_loss(logits, targets)[0], task.xent(logits, targets, smoothing=0.0))
    else:
        assert not torch.allclose(task.target_loss(logits, targets)[0], task.xent(logits, targets, smoothing=0.0))


@pytest.mark.parametrize("arch", [["model=decoder_only", "task=seq2seq_lm"], ["model=encoder_only", "task=transduce"]])
def test_pair_tasks_train_and_report_exact_match(tmp_path, arch):
    m = run(compose(tiny_overrides(steps=3) + arch + ["data.batch_size=16"]), tmp_path / "run")
    assert math.isfinite(m["val"]["val/loss"]) and 0 <= m["val"]["val/exact_match"] <= 1
    assert math.isfinite(m["val"]["val/target_loss"])
    assert " -> " in m["sample"] and "(reference: " in m["sample"]


def test_sliding_windows_score_every_target_once_with_the_declared_context():
    """data.val_stride S: windows every S tokens, each scoring its last S targets: together they score each
    target from index N - S + 1 on exactly once (no gap, no double count), every one with >= N - S tokens before."""
    from modforge.data.lm import Windows
    from modforge.tasks.base import IGNORE

    tokens, n, stride = torch.arange(200), 32, 8
    ds = Windows(tokens, n, range(0, len(tokens) - n, stride), stride)
    scored = []
    for i in range(len(ds)):
        x, y = ds[i]
        keep = y != IGNORE
        assert keep.sum() == stride and not keep[: n - stride].any()
        scored += y[keep].tolist()
        assert all(int(t) - int(x[0]) >= n - stride + 1 for t in y[keep])  # context: from the window's start
    assert scored == list(range(n - stride + 1, scored[-1] + 1))


def test_eval_block_sizes_validates_longer_where_positions_allow(tmp_path, monkeypatch):
    """val@N is the same validation at another window length: at the training length it is val/loss itself;
    RoPE runs at 4x its max_len; a learned table is 'not applicable' there, and the curves get no extra points."""
    base = tiny_overrides(steps=2) + ["data.block_size=32", "eval_block_sizes=[32,128]", "sample=false"]
    for k in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AVX2")  # recorded only: MKL read it, if at all, when this process started
    m = run(compose(base + ["pos=rope", "eval_stride=32", "eval_by_position=true"]), tmp_path / "rope")
    assert m["val"]["val@32/loss"] == pytest.approx(m["val"]["val/loss"], abs=1e-6)
    assert math.isfinite(m["val"]["val@128/loss"]) and "not_applicable" not in m
    # per position: every window scores every position, so their mean is the loss; sliding windows of stride N
    # are the non-overlapping ones; at 128 with stride 32 each scored token sees >= 96 tokens of context
    by = m["by_position"]
    assert m["devices"]["cpu_threads"] == torch.get_num_threads()  # what re-running it to the last digit needs
    assert m["devices"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and m["devices"]["cpu"]  # and on which kernels
    assert m["devices"]["cpu_kernel_env"] == {"MKL_CBWR": "AVX2"}  # and what pinned them
    assert len(by["val@32"]) == 32 and len(by["val@128"]) == 128
    assert sum(by["val@32"]) / 32 == pytest.approx(m["val"]["val@32/loss"], abs=1e-5)
    assert m["val"]["slide32@32/loss"] == pytest.approx(m["val"]["val@32/loss"], abs=1e-6)
    assert math.isfinite(m["val"]["slide32@128/loss"]) and m["val"]["slide32@128/loss"] != m["val"]["val@128/loss"]
    with open(tmp_path / "rope" / "logs" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/loss")]
    assert len(rows) == 2 and not any(k.startswith("val@") for k in rows[0])  # step 0 and step 2 only
    m = run(compose(base + ["pos=learned"]), tmp_path / "learned")
    assert "val@32/loss" in m["val"] and "val@128/loss" not in m["val"] and m["status"] == "finished"
    assert "none for positions 64..127" in m["not_applicable"]["val@128"]
