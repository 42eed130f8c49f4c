"""Untrusted files and bad input: one clear line, nothing executed.

A checkpoint is a pickle; loading one with ``weights_only=False`` runs whatever
it pickled. Every load in modforge (``load_checkpoint``, ``generate ckpt=``,
``train resume=``) is weights-only, so a crafted file is refused and its code never runs.
"""
import pytest
import torch

from conftest import tiny_overrides
from modforge.checkpoints.files import load_checkpoint, read_checkpoint
from modforge.config import compose
from modforge.registry import ConfigError
from modforge.run.story import run


class CreatesAFile:
    """Unpickling this object would create ``path`` (what an attacker's payload would do instead)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def crafted(tmp_path):
    marker = tmp_path / "PWNED"
    ckpt = {"state_dict": {}, "hyper_parameters": {"run_cfg": {}, "payload": CreatesAFile(marker)}}
    path = tmp_path / "crafted.ckpt"
    torch.save(ckpt, path)
    assert not marker.exists()
    return path, marker


def test_load_checkpoint_refuses_a_crafted_file(crafted):
    path, marker = crafted
    with pytest.raises(ConfigError, match=r"ckpt=.*crafted.ckpt: refused: .*could run code") as e:
        load_checkpoint(str(path))
    assert "\n" not in str(e.value) and not marker.exists()


def test_generate_refuses_a_crafted_file_in_one_line(crafted, capsys):
    from modforge.generate import main

    path, marker = crafted
    with pytest.raises(SystemExit) as e:
        main([f"ckpt={path}", "prompt=x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ckpt=") and "refused" in err and err.count("\n") == 1
    assert "Traceback" not in err and not marker.exists()


def test_resume_refuses_a_crafted_file_before_any_work(crafted, tmp_path):
    path, marker = crafted
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="resume=.*refused"):
        run(compose(tiny_overrides(steps=1) + [f"resume={path}"]), out)
    assert not marker.exists() and not (out / "checkpoints").exists()


@pytest.mark.parametrize("content,match", [(b"", "not a readable checkpoint"), (b"garbage" * 10, "not a readable"),
                                           (None, "not a modforge checkpoint")])
def test_unreadable_or_foreign_files_are_one_line(tmp_path, content, match):
    path = tmp_path / "x.ckpt"
    if content is None:
        torch.save({"weights": torch.zeros(2)}, path)  # a real, safe checkpoint, but not modforge's
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=match) as e:
        read_checkpoint(path, "resume")
    assert "\n" not in str(e.value)


def test_what_modforge_writes_loads_weights_only(tmp_path):
    """Everything a run stores in its checkpoint (Lightning's loops and callbacks, our facts) is plain data."""
    m = run(compose(tiny_overrides(steps=1) + ["data.max_chars=20000", "sample=false", "eval_at_start=false"]), tmp_path)
    ckpt = torch.load(m["checkpoint"], weights_only=True)
    assert ckpt["global_step"] == 1 and "data_facts" in ckpt["hyper_parameters"]


# --------------------------------------------------------------------------- the table of bad inputs
# Each case: the command, its arguments, and a piece of the one line it must print. Every case must end with
# exit code 2, one line on stderr naming the key or the file, no traceback, and no training work (no checkpoint).
# {run}: a tiny finished run (2 steps); {crafted}: a checkpoint that would create a file if unpickled;
# {garbage}, {foreign}: a file that is no checkpoint, a safe checkpoint that is not modforge's; {latin},
# {binary}, {latin_csv}: text files that are not UTF-8 text; {file}: a plain file; {sweep}: a report directory.

TRAIN = [
    (["norm=rmss"], "Did you mean 'rms'"),
    (["norm.epz=1"], "Did you mean 'eps'"),
    (["experiment=shakespeare"], "Did you mean 'shakespeare_char'"),
    (["+modle=encoder_only"], "'modle' is not a key or group"),
    (["modle=encoder_only"], "Did you mean 'model'"),
    (["+logger=wandb"], "+logger=wandb: logger is a config group that always has an option; choose one with logger=wandb"),
    (["+compile=true"], "Either remove + prefix: 'compile=true'"),
    (["seed=abc"], "seed must be an integer"),
    (["experiment=norm_quick", "study.margin=-1"], "study.margin=-1: the equivalence margin, a positive number"),
    (["experiment=norm_quick", "+study.hypothesis=x"], "study.hypothesis: not a key of a study block"),
    (["experiment=norm_quick", "study.compare=[rms]"], "study.compare=['rms']: the family"),
    (["sample=maybe"], "sample must be true or false"),
    (["eval_at_start=3"], "eval_at_start must be true or false"),
    (["resume.x=1"], "resume is a value"),
    (["model=encoder_only", "task=causal_lm"], "task=causal_lm trains a causal decoder"),
    (["task=seq2seq", "model=decoder_only"], "model=decoder_only is not one. Models that fit: encoder_decoder"),
    (["model=encoder_decoder", "data=stdlib"], "data=stdlib gives a token stream"),
    (["data=reverse"], "data=reverse gives source/target pairs"),
    (["model=encoder_decoder", "eval_block_sizes=[64]"], "data=reverse has no block_size"),
    (["eval_block_sizes=[0]"], "eval_block_sizes must be a list of positive integers"),
    (["eval_block_sizes=128"], "eval_block_sizes must be a list of block sizes"),
    (["eval_stride=16"], "eval_stride=16: it applies to the evaluations of eval_block_sizes, which is empty"),
    (["eval_block_sizes=[64]", "eval_stride=100"], "eval_stride=100: must be at most the shortest"),
    (["data.val_stride=100"], "data.val_stride=100: an integer in [1, data.block_size=64]"),
    (["model=encoder_only", "task=seq2seq_lm"], "task=seq2seq_lm trains a causal decoder"),
    (["model=encoder_only", "data=classify"], "data.path"),
    (["model=encoder_only", "task=classify", "data=stdlib"], "task=classify needs data of labelled examples"),
    (["trainer.max_steps=-5"], "trainer.max_steps=-5"),
    (["optim.lr=-1"], "optim.lr=-1.0: must be > 0"),
    (["optim.betas=[0.9,1.5]"], "optim.betas"),
    (["task.label_smoothing=2"], "task.label_smoothing=2.0"),
    (["data.num_workers=-1"], "data.num_workers=-1"),
    (["data.val_fraction=1.5"], "data.val_fraction=1.5"),
    (["data.batch_size=0"], "data.batch_size=0"),
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval=0"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val=-1"),
    (["trainer=gpu"], "no CUDA GPU is visible"),
    (["trainer=gpux"], "Unknown trainer 'gpux'"),
    (["trainer.acumulate_grad_batches=2"], "Did you mean 'accumulate_grad_batches'"),
    (["trainer.logger=false"], "trainer.logger: choose loggers with logger=..."),
    (["logger=tensorbord"], "Did you mean 'tensorboard'"),
    (["logger=wandb"], "logger=wandb needs the wandb package: pip install 'modforge[loggers]'"),
    (["+logger.mine._target_=collections.OrderedDict"], "not a lightning Logger"),
    (["hydra/launcher=joblibb"], "Did you mean 'joblib'"),
    (["activation=silu"], "ffn.activation"),
    (["+tokenizer=bpe"], "data.tokenizer"),
    (["ffn.activation=gelux"], "Did you mean 'gelu'"),
    (["data.tokenizer=bpee"], "Did you mean 'bpe'"),
    (["data.tokenizer=bpe", "data.vocab_size=100"], "data.vocab_size=100"),
    (["data.vocab_size=300"], "tokenizer 'char' takes no vocab_size"),
    (["model.d_model=big"], "model.d_model=big"),
    (["model.n_heads=3"], "divisible by model.n_heads=3"),
    (["model.dropout=1.5"], "model.dropout=1.5"),
    (["data.block_size=1000"], "model.max_len=256 is shorter"),
    (["scheduler=noam", "scheduler.warmup_steps=0"], "noam needs >= 1"),
    (["scheduler.min_lr_ratio=2"], "scheduler.min_lr_ratio=2"),
    (["norm=[a"], "not a valid override"),
    (["norm=rms", "norm.eps_placement=sideways"], "norm.eps_placement='sideways'"),
    (["norm.eps_placement=inside"], "It is not a key of the option chosen in its group"),
    (["hydra.run.dir=/proc/x"], "hydra.run.dir=/proc/x"),
    (["hydra.run.dir={file}/sub"], "is a file"),
    (["data=text"], "data.path"),
    (["data=text", "data.path=/nonexistent/x.txt"], "no such file"),
    (["data=text", "data.path={latin}"], "not valid utf-8 text at byte 3"),
    (["data=text", "data.path={binary}"], "a binary file"),
    (["data=text", "data.path={latin}", "data.encoding=latin-9x"], "data.encoding=latin-9x"),
    (["model=encoder_only", "task=classify", "data=classify", "data.path={latin_csv}"], "not valid utf-8"),
    (["data=tinyshakespeare", "data.path=/nonexistent/input.txt"], "no such file"),
    (["-m", "model.n_heads=4,3"], "1 of 2 jobs are invalid, so the sweep does not start: #1 (model.n_heads=3)"),
    (["-m", "norm=layer,rmss"], "Did you mean 'rms'"),
    (["-m", "seed=1,abc"], "seed must be an integer"),
    (["-m", "experiment=norm_quick", "model.n_heads=3"], "9 of 9 jobs are invalid"),
    (["-m", "seed=1", "hydra/launcher=gpus", "hydra.launcher.devices=1", "hydra.launcher.jobs_per_device=0"],
     "hydra.launcher.jobs_per_device=0: a whole number of jobs >= 1"),
    (["resume=/nonexistent/run"], "no checkpoint at /nonexistent/run"),
    (["resume={garbage}"], "not a readable checkpoint"),
    (["resume={crafted}"], "refused"),
    (["resume={foreign}"], "not a modforge checkpoint"),
    (["resume={run}", "model.d_model=64"], "a resumed run keeps its model"),
    (["resume={run}", "norm=rms"], "the run being resumed has norm=layer"),
    (["resume={run}", "trainer.max_steps=2"], "that run has finished (step 2 of trainer.max_steps=2)"),
    (["resume={rng}", "trainer.max_steps=3"], "its rng_states cannot be restored: TypeError"),
    (["resume={data_rng}", "trainer.max_steps=3"], "its task_data_rng cannot be restored: TypeError"),
    (["trainer.devices=0"], "trainer.devices=0"),
    (["trainer.precision=17"], "trainer.precision=17"),
    (["trainer.strategy=foo"], "trainer.strategy=foo"),
    (["trainer.max_epochs=-5"], "trainer.max_epochs=-5"),
    (["trainer.check_val_every_n_epoch=0"], "trainer.check_val_every_n_epoch=0"),
    (["trainer.val_check_interval=0.5"], "needs trainer.check_val_every_n_epoch=1"),
    (["trainer.max_steps=-1", "trainer.max_epochs=1"], "scheduler=cosine needs scheduler.total_steps"),
    (["model.d_ff=-1"], "model.d_ff=-1"),
    (["model.init_std=-1"], "model.init_std=-1"),
    (["attention.dropout=2"], "attention.dropout=2.0"),
    (["seed=-1"], "seed must be in [0, 2^32 - 1]"),
    (["param=mup", "param.depth_alpha=2"], "param.depth_alpha=2.0: in [0, 1]"),
    (["param=mup", "+param.base.widht=64"], "param.base.widht: not a key of the model's config"),
    (["param=mup", "optim=adam", "optim.weight_decay=0.1"], "optim=adam with optim.weight_decay=0.1: the parametrisation has no rule"),
    (["param=mup", "model.d_model=96", "model.n_heads=3"], "param.base={'d_model': 128}: the base shape is not a valid model"),
    (["param=mup", "norm=scale"], "parameter 'decoder.blocks.0.r_self.norm.g' (modforge_extras.ScaleNorm) has no declared role"),
    (["divergence_patience=0"], "divergence_patience must be >= 1"),
    (["callbacks.progress=fancy"], "callbacks.progress=fancy: one of auto, tqdm, rich, log, none"),
    (["+callbacks.mine._target_=no.such.Callback"], "callbacks.mine._target_=no.such.Callback: cannot be imported"),
    (["+callbacks.mine._target_=collections.OrderedDict"], "not a lightning Callback"),
    (["callbacks=early_stoping"], "Did you mean 'early_stopping'"),
    (["-m", "resume=/nonexistent-sweep"], "resume=/nonexistent-sweep: no checkpoint at"),
    (["-m", "resume={run}", "norm=rms"], "the run being resumed has norm="),
    (["task.sample_temperature=0"], "task.sample_temperature=0.0"),
    (["scheduler=constant", "scheduler.warmup_steps=-5"], "scheduler.warmup_steps=-5"),
    (["~norm"], "modforge needs norm"),
    (["~trainer.max_steps"], "modforge needs trainer.max_steps"),
    (["norm", "rms"], "'norm': expected key=value"),
    (["norm=null"], "must be a string"),
    (["-m", "optim.lr=interval(0.001,0.01)"], "the sweep cannot be expanded into jobs"),
    (["data.encoding=rot13"], "data.encoding=rot13"),
    (["-m", "data=text", "data.path={latin},/nonexistent/b.txt"], "1 of 2 jobs are invalid"),
    (["model=encoder_decoder", "data=parallel", "data.path=/nonexistent/p.tsv"], "data.path=/nonexistent/p.tsv"),
]

GENERATE = [
    (["prompt=hi"], "ckpt=<run dir or .ckpt> is required"),
    (["ckpt=/nonexistent.ckpt"], "no checkpoint at /nonexistent.ckpt"),
    (["ckpt={crafted}"], "refused"),
    (["ckpt={garbage}"], "not a readable checkpoint"),
    (["ckpt={run}", "strategy=nucleus"], "strategy=nucleus"),
    (["ckpt={run}", "beam=3"], "Did you mean 'beam_size'"),
    (["ckpt={run}", "beam_size=0"], "beam_size=0"),
    (["ckpt={run}", "max_new=-1"], "max_new=-1"),
    (["ckpt={run}", "top_p=2"], "top_p=2.0"),
    (["ckpt={run}", "top_k=-3"], "top_k=-3"),
    (["ckpt={run}", "temperature=-1"], "temperature=-1.0"),
    (["ckpt={run}", "num_samples=0"], "num_samples=0"),
    (["ckpt={run}", "length_penalty=-1"], "length_penalty=-1.0"),
    (["ckpt={run}", "max_new=many"], "max_new"),
    (["ckpt={run}", "device=cuda"], "no CUDA GPU"),
    (["ckpt={run}", "prompt=漢字 and €"], "vocabulary does not have: '€' '字' '漢'"),
    (["ckpt={run}", "device=foo"], "device=foo: not a device name"),
    (["ckpt={run}", "prompt=${{oc.env:HOME}} ☃"], "'☃'"),  # the prompt is text, never an interpolation
    (["ckpt={run}", "max_new=2", "max_new=3"], "max_new= given twice (max_new=2, then max_new=3): give it once"),
    (["ckpt={nan}", "prompt=a"], "its weight model.tok.weight holds non-finite values (NaN or inf)"),
    (["ckpt={nan}", "prompt=a", "strategy=beam"], "its weight model.tok.weight holds non-finite values"),
    (["ckpt={nan}", "prompt=a", "strategy=sample"], "its weight model.tok.weight holds non-finite values"),
    (["ckpt={abc}", "prompt=a"], "model.d_model='abc': must be a whole number"),
]

REPORT = [
    ([], "name the sweep directory"),
    (["/nonexistent"], "no such directory"),
    (["{file}"], "no such directory"),
    (["{sweep}", "metric=val/los"], "Metrics that exist"),
    (["{sweep}", "sort=worst"], "sort=worst"),
    (["{sweep}", "format=xml"], "format=xml"),
    (["{sweep}", "level=2"], "level=2"),
    (["{sweep}", "over=sed"], "over=sed"),
    (["{sweep}", "baseline=x=1"], "baseline=x=1"),
    (["{sweep}", "metrc=x"], "'metrc=x': expected key=value"),
    (["{sweep}", "best=low"], "best=low"),
]


DAMAGED = {
    "nan": lambda c: [v.fill_(float("nan")) for v in c["state_dict"].values() if v.is_floating_point()],
    "abc": lambda c: c["hyper_parameters"]["run_cfg"]["model"].update(d_model="abc"),
    "rng": lambda c: c.update(rng_states={**c["rng_states"], "torch": "x"}),
    "data_rng": lambda c: c.update(task_data_rng="x"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    run_dir = d / "run"
    run(compose(tiny_overrides(steps=2) + ["data.max_chars=20000", "sample=false", "eval_at_start=false"]), run_dir)
    (d / "garbage.ckpt").write_bytes(b"garbage" * 10)
    torch.save({"weights": torch.zeros(2)}, d / "foreign.ckpt")
    torch.save({"state_dict": {}, "hyper_parameters": {"run_cfg": {}, "x": CreatesAFile(d / "PWNED")}}, d / "crafted.ckpt")
    (d / "latin.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 500)
    (d / "binary.txt").write_bytes(b"text\x00more\n" * 500)
    (d / "latin.csv").write_bytes("text,label\ncaf\xe9,pos\nthe,neg\n".encode("latin-1"))
    (d / "file").write_text("x")
    sweep = d / "sweep" / "0_a=1"
    (sweep / ".hydra").mkdir(parents=True)
    (sweep / ".hydra" / "overrides.yaml").write_text("- a=1\n- seed=1\n")
    (sweep / "metrics.json").write_text('{"val": {"val/loss": 1.0}}')
    names = {"run": run_dir, "crafted": d / "crafted.ckpt", "garbage": d / "garbage.ckpt", "foreign": d / "foreign.ckpt",
             "latin": d / "latin.txt", "binary": d / "binary.txt", "latin_csv": d / "latin.csv", "file": d / "file",
             "sweep": d / "sweep"}
    for name, damage in DAMAGED.items():  # the run's checkpoint, one part of it damaged
        ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
        damage(ckpt)
        torch.save(ckpt, d / f"{name}.ckpt")
        names[name] = d / f"{name}.ckpt"
    return {k: str(v) for k, v in names.items()}, d


def run_bad(main, argv, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2, (argv, out[-2000:], err[-2000:])
    assert "Traceback" not in out + err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv,msg", TRAIN, ids=[" ".join(a) for a, _ in TRAIN])
def test_train_refuses(argv, msg, files, tmp_path, capsys):
    from modforge.train import main

    names, d = files
    argv = [a.format(**names) for a in argv]
    if not any(a.startswith("hydra.run.dir") for a in argv):
        argv.append(f"hydra.sweep.dir={tmp_path}/sweep" if "-m" in argv else f"hydra.run.dir={tmp_path}/run")
    err = run_bad(main, argv, capsys)
    assert msg in err, err
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("metrics.json"))  # no training work
    assert not (d / "PWNED").exists()


@pytest.mark.parametrize("argv,msg", GENERATE, ids=[" ".join(a) for a, _ in GENERATE])
def test_generate_refuses(argv, msg, files, capsys):
    from modforge.generate import main

    names, d = files
    err = run_bad(main, [a.format(**names) for a in argv], capsys)
    assert msg in err, err
    assert not (d / "PWNED").exists()


@pytest.mark.parametrize("argv,msg", REPORT, ids=[" ".join(a) for a, _ in REPORT])
def test_report_refuses(argv, msg, files, capsys):
    from modforge.report import main

    names, _ = files
    err = run_bad(main, [a.format(**names) for a in argv], capsys)
    assert msg in err, err


def test_generate_bounds_max_new_before_loading_anything():
    """max_new=99999999999999999999 generated for ever (printing nothing until the end): refused in one line with
    the range, before the checkpoint is looked at (a regression fails here instead of hanging a table row)."""
    from modforge.generate import parse

    with pytest.raises(ConfigError, match=r"^max_new=99999999999999999999: must be an integer in \[1, 100000\]"):
        parse(["ckpt=/nonexistent.ckpt", "max_new=99999999999999999999"])
    assert parse(["ckpt=/nonexistent.ckpt", "max_new=100000"]).max_new == 100000


def test_the_table_is_long_enough():
    assert len(TRAIN) + len(GENERATE) + len(REPORT) >= 60


def test_a_full_disk_while_writing_names_the_file(tmp_path, monkeypatch, capsys):
    """ENOSPC in the middle of writing: one line naming the file; the previous version of the file stays whole."""
    import builtins
    import errno

    import modforge.utils.files
    from modforge.cli.command import one_line_errors
    from modforge.utils.files import write_text

    target = tmp_path / "metrics.json"
    write_text(target, "old\n")

    class FullDisk:
        def __init__(self, *a, **k):
            self.fh = builtins.open(*a, **k)

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")  # as the kernel says it: no file name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr(modforge.utils.files, "open", FullDisk, raising=False)
    with pytest.raises(SystemExit) as e, one_line_errors():
        write_text(target, "new\n")
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"error: {target}: No space left on device\n"
    assert target.read_text() == "old\n" and not list(tmp_path.glob(".metrics.json.*.tmp"))


@pytest.mark.parametrize("argv,jobs", [(["-m", "ffn=glob(*glu)"], 4), (["-m", "seed=range(1,4)", "norm=layer,rms"], 6),
                                       (["-m", "experiment=norm_quick"], 9), (["norm=rms"], 1)])
def test_hydra_sweep_syntax_passes_and_every_job_is_checked(argv, jobs):
    from modforge.cli.preflight import preflight

    assert preflight(argv, multirun="-m" in argv).jobs == jobs


def test_a_resumed_run_keeps_the_checkpoints_tokenizer_and_may_move_its_data(tmp_path):
    """Resuming on changed text reads it with the model's own ids (never a refitted tokenizer), and keys that
    say where the data is or how it is loaded may change."""
    corpus = tmp_path / "a.txt"
    corpus.write_text("abcde fghij\n" * 400)
    first = run(compose(tiny_overrides(steps=2) + ["data=text", f"data.path={corpus}", "sample=false",
                                                   "eval_at_start=false"]), tmp_path / "a")
    moved = tmp_path / "b.txt"
    moved.write_text("abcde fghiq\n" * 400)  # same vocabulary size, one character swapped
    from modforge.run.resume import resumed_config, resume_path

    cfg = compose(tiny_overrides(steps=4) + ["data=text", f"data.path={moved}", "data.num_workers=0",
                                             f"resume={tmp_path / 'a'}", "sample=false"])
    adopted = resumed_config(cfg, resume_path(cfg.resume), ["data.path", "data.num_workers", "trainer.max_steps"])
    assert adopted.data.path == str(moved) and adopted.trainer.max_steps == 4
    assert adopted.trainer.limit_val_batches == 2  # not set on this command line: the run's own
    m = run(cfg, tmp_path / "b")
    from modforge.checkpoints.files import load_checkpoint

    assert load_checkpoint(m["checkpoint"]).tokenizer.state() == load_checkpoint(first["checkpoint"]).tokenizer.state()
