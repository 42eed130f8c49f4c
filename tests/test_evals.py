"""Downstream evaluations (issue 53, items 4-5): ranked log-likelihood against a direct computation, the
harness adapter against lm-evaluation-harness itself, the in-loop evaluations against the eval verb, bad task
files, and a downstream accuracy as a study's metric."""
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import run_module, tiny_overrides
from modforge.config import compose
from modforge.errors import ConfigError
from modforge.evals.scoring import encode_pair, loglikelihoods, score
from modforge.evals.tasks import load_task
from modforge.run.story import run

TEXTS = ["def f(x):\n    return x + 1\n", "import os\nimport sys\n\nprint(os.getcwd())\n" * 3, "class A:\n    pass\n"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny causal model trained a few steps on stdlib, with the built-in task and a text task in its loop."""
    d = tmp_path_factory.mktemp("evals")
    text = d / "pytext.jsonl"
    text.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    m = run(compose(tiny_overrides(steps=8) + ["data.max_chars=50000", "sample=false", "model.max_len=32",
                                               "data.block_size=32", f"task.evals=[pycloze,{text}]"]), d / "run")
    from modforge.checkpoints import load_checkpoint

    return d, m, load_checkpoint(m["checkpoint"]).eval(), text


def direct(model, ctx: list, cont: list, max_len: int) -> float:
    """One request alone, unpadded: the sum of the continuation's log-probabilities."""
    inp = (ctx + cont)[-(max_len + 1):]
    with torch.no_grad():
        lp = F.log_softmax(model(torch.tensor([inp[:-1]]))[0].double(), -1)
    n = len(cont)
    return float(sum(lp[len(inp) - 1 - n + i, t] for i, t in enumerate(inp[len(inp) - n:])))


def test_batched_log_likelihoods_equal_each_request_run_alone(trained):
    _, _, task, _ = trained
    tok, L = task.tokenizer, task.context_len
    reqs = [encode_pair(tok, c, x, tok.eos_id) for c, x in
            [("def f(", "x):"), ("", "import os"), ("a" * 50, "bc"), ("import ", "sys"), ("x = 1  ", "+ 2")]]
    got = loglikelihoods(task.model, reqs, L, batch_size=2)
    for (ctx, cont), (ll, greedy) in zip(reqs, got):
        assert ll == pytest.approx(direct(task.model, ctx, cont, L), abs=1e-4)
    assert reqs[1][0] == [tok.eos_id]  # an empty context: the end-of-text id before it
    ctx, cont = encode_pair(tok, "x = 1  ", "+ 2", tok.eos_id)  # trailing spaces move to the continuation
    assert tok.decode(ctx) == "x = 1" and tok.decode(cont) == "  + 2"


def test_choice_scores_equal_their_definitions(trained):
    _, _, task, _ = trained
    tok, L = task.tokenizer, task.context_len
    t = load_task("pycloze")
    s = score(task.model, tok, t, L, batch_size=5).metrics()
    correct = correct_norm = bits = nbytes = 0.0
    for it in t.items:
        ll = [direct(task.model, *encode_pair(tok, it["context"], c, tok.eos_id), L) for c in it["choices"]]
        correct += max(range(len(ll)), key=lambda i: (ll[i], -i)) == it["label"]
        norm = [v / len(c) for v, c in zip(ll, it["choices"])]
        correct_norm += max(range(len(norm)), key=lambda i: (norm[i], -i)) == it["label"]
        bits += -ll[it["label"]] / math.log(2)
        nbytes += len(it["choices"][it["label"]].encode())
    assert s["acc"] == correct / len(t) and s["acc_norm"] == correct_norm / len(t)
    assert s["bpb"] == pytest.approx(bits / nbytes, rel=1e-6)


def harness_task(d: Path, name: str, data: Path, kind: str, delimiter: str = "") -> None:
    body = {"choice": "output_type: multiple_choice\ndoc_to_text: context\ndoc_to_choice: choices\n"
                      f"doc_to_target: label\ntarget_delimiter: \"{delimiter}\"\nmetric_list:\n  - metric: acc\n"
                      "  - metric: acc_norm\n",
            "text": "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: text\n"
                    "metric_list:\n  - metric: bits_per_byte\n"}[kind]
    (d / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                    f"    test: {data}\n  cache_dir: {d / 'hf'}\ntest_split: test\n" + body)


def test_the_harness_adapter_gives_lm_evaluation_harness_our_figures(trained, tmp_path):
    """The harness computes acc, acc_norm and bits per byte itself, from the adapter's log-likelihoods: equal to
    :func:`score`'s, which the tests above check against their definitions."""
    d, _, task, text = trained
    harness_task(tmp_path, "tiny_mc", load_task("pycloze").source, "choice")
    harness_task(tmp_path, "tiny_text", text, "text")
    # the same items with a space before each choice: ours writes it in the choices, the harness's delimiter adds it
    # (and its acc_norm divides by the choice without it)
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text("".join(json.dumps({**it, "choices": [" " + c for c in it["choices"]]}) + "\n"
                              for it in load_task("pycloze").items))
    harness_task(tmp_path, "tiny_mc_space", load_task("pycloze").source, "choice", delimiter=" ")
    assert len(task.tokenizer.encode(TEXTS[1])) > task.context_len  # (a text of more than one window)
    p = run_module("modforge", d, "eval", f"ckpt={d / 'run'}", "harness=tiny_mc,tiny_text,tiny_mc_space",
                   f"harness_include={tmp_path}", f"out={tmp_path / 'h.json'}")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads((tmp_path / "h.json").read_text())
    ours = score(task.model, task.tokenizer, load_task("pycloze"), task.context_len).metrics()
    assert out["tiny_mc"]["acc"] == ours["acc"] and out["tiny_mc"]["acc_norm"] == ours["acc_norm"]
    assert out["tiny_mc"]["n"] == 32
    text_bpb = score(task.model, task.tokenizer, load_task(str(text)), task.context_len).metrics()["bpb"]
    assert out["tiny_text"]["bits_per_byte"] == pytest.approx(text_bpb, rel=1e-9)
    ours_spaced = score(task.model, task.tokenizer, load_task(str(spaced)), task.context_len).metrics()
    assert out["tiny_mc_space"]["acc"] == ours_spaced["acc"]
    assert out["tiny_mc_space"]["acc_norm"] == ours_spaced["acc_norm"]


def test_text_windows_are_the_harness_s_rolling_windows():
    """lm-evaluation-harness's own get_rolling_token_windows + make_disjoint_window (context 1) as the reference:
    every id predicted once, the last, shorter window with a full window of input."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    from modforge.evals.scoring import rolling_windows

    for n in range(1, 26):
        for length in (1, 2, 3, 5, 8):
            ids = list(range(10, 10 + n))
            ref = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=ids, prefix_token=0, max_seq_len=length, context_len=1)]
            assert [(list(a), list(b)) for a, b in ref] == rolling_windows(ids, 0, length), (n, length)


def test_in_loop_evaluations_equal_the_eval_verb(trained):
    d, m, _, text = trained
    v = m["val"]
    for key in ("val/pycloze/acc", "val/pycloze/acc_norm", "val/pycloze/bpb", "val/pytext/bpb"):
        assert key in v
    assert "val/pytext/acc" not in v
    p = run_module("modforge", d, "eval", f"ckpt={d / 'run'}", f"tasks=pycloze,{text}", f"out={d / 'e.json'}")
    assert p.returncode == 0, p.stderr[-2000:]
    e = json.loads((d / "e.json").read_text())
    assert e["pycloze"]["n"] == 32 and e["pycloze"]["acc"] == pytest.approx(v["val/pycloze/acc"], abs=1e-6)
    assert e["pycloze"]["bpb"] == pytest.approx(v["val/pycloze/bpb"], rel=1e-5)
    assert e["pytext"]["bpb"] == pytest.approx(v["val/pytext/bpb"], rel=1e-5)
    assert "| pycloze | 32 |" in p.stdout
    info = json.loads((d / "run" / "metrics.json").read_text())["metric_info"]
    assert info["val/pycloze/acc"] == {"low": 0.0, "high": 1.0, "better": "max"}
    assert info["val/pytext/bpb"] == {"low": 0.0, "high": None, "better": "min"}


@pytest.mark.parametrize("content, message", [
    ('{"context": "a", "choices": ["b", "c"], "label": 2}\n', r"line 1: \"label\"=2 must be the index of the right "
                                                               r"choice, 0..1"),
    ('{"context": "a", "choices": ["b"], "label": 0}\n', r"line 1: \"choices\" must be a list of at least 2"),
    ('{"text": "a"}\nnot json\n', r"line 2: not JSON"),
    ('{"text": "a"}\n{"context": "a", "choices": ["b", "c"], "label": 0}\n', r"line 2 is a choice item among text"),
    ('\n\n', r"no items"),
    ('{"question": "a"}\n', r"line 1: neither a multiple-choice item"),
])
def test_bad_task_files_are_refused_in_one_line(tmp_path, content, message):
    (tmp_path / "t.jsonl").write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_task(str(tmp_path / "t.jsonl"))


def test_bad_eval_commands_are_refused_in_one_line_before_loading_a_model(tmp_path):
    for argv, message in ((["ckpt=nowhere", "tasks=pyclose"], r"tasks=pyclose: not a built-in task \(pycloze\)"),
                          (["ckpt=nowhere"], r"tasks= or harness=: name at least one task"),
                          (["ckpt=nowhere", "tasks=pycloze"], r"ckpt=nowhere")):
        p = run_module("modforge", tmp_path, "eval", *argv)
        assert p.returncode == 2 and p.stderr.count("error:") == 1 and "Traceback" not in p.stderr, p.stderr
        assert re.search(message, p.stderr), p.stderr
    p = run_module("modforge.train", tmp_path, *tiny_overrides(steps=1), "task.evals=[nope.jsonl]", "hydra.run.dir=r")
    assert p.returncode == 2 and re.search(r"task.evals=nope.jsonl: no such file", p.stderr), p.stderr[-2000:]


def test_a_downstream_accuracy_is_a_study_metric_with_its_range(trained):
    from modforge.studies import writeup
    from modforge.studies.runner import check_metric

    with_evals = compose(["task.evals=[pycloze]"])
    check_metric("val/pycloze/acc", with_evals, "the baseline")
    with pytest.raises(ConfigError, match=r"study.metric=val/pycloze/acc: not a validation metric of task=causal_lm"):
        check_metric("val/pycloze/acc", compose([]), "the baseline")
    d, m, _, _ = trained
    records = [{"metrics": json.loads((d / "run" / "metrics.json").read_text())}]
    values = [0.97, 1.0, 0.99]  # near the top of the range: the interval stays inside [0, 1]
    iv = writeup.arm_interval(values, records, "val/pycloze/acc", 0.95)
    assert iv.kind == "logit-t" and 0.0 <= iv.low < iv.estimate < iv.high <= 1.0
    plain = writeup.arm_interval(values, [{"metrics": {}}], "val/other", 0.95)  # no range known: a plain t
    assert plain.high > 1.0


def test_the_harness_adapter_generates_greedily_and_stops_at_its_strings(trained):
    from types import SimpleNamespace

    from modforge.harness import ModforgeLM
    from modforge.models.decoding import generate

    _, _, task, _ = trained
    lm = ModforgeLM(task=task)
    whole = generate(task.model, task.tokenizer, prompt="def f(", strategy="greedy", max_new=12,
                     max_context=task.context_len)
    stop = next((ch for ch in whole[1:] if ch.strip()), None)  # a character the greedy text holds past its start
    (plain, cut) = lm.generate_until([SimpleNamespace(args=("def f(", {"max_gen_toks": 12})),
                                      SimpleNamespace(args=("def f(", {"until": [stop], "max_gen_toks": 12}))])
    assert plain == whole and cut == whole[: whole.index(stop, 0)] and len(cut) < len(whole)
