"""Untrusted files and bad input: one clear line, nothing executed.

A checkpoint is a pickle; loading one with ``weights_only=False`` runs whatever
it pickled. Every load in modforge (``load_checkpoint``, ``generate ckpt=``,
``train resume=``) is weights-only, so a crafted file is refused and its code never runs.
"""
import pytest
import torch

from conftest import tiny_overrides
from modforge.checkpoints import load_checkpoint, read_checkpoint
from modforge.config import compose
from modforge.registry import ConfigError
from modforge.train import run


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
