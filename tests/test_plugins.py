"""Third-party plugins through the ``modforge.plugins`` entry point.

Fake distributions are built in ``tmp_path`` (a ``*.dist-info`` directory with
METADATA and entry_points.txt next to the plugin module) and put on
PYTHONPATH of a subprocess, so the global registry of this process never sees
them. The end-to-end checks use the example plugin ``examples/modforge-extras``
when it is installed.
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import python, run_in_process
import yaml

REPO = Path(__file__).resolve().parent.parent
EXTRAS_INSTALLED = importlib.util.find_spec("modforge_extras") is not None
needs_extras = pytest.mark.skipif(
    not EXTRAS_INSTALLED,
    reason="example plugin not installed: pip install -e examples/modforge-extras",
)

TINY = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=32", "data.block_size=32"]


def make_dist(root: Path, dist: str, version: str, module: str, source: str) -> None:
    """A minimal installed distribution: ``module.py`` plus its dist-info with one modforge entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[modforge.plugins]\n{module} = {module}\n")


def norm_plugin(*names: str) -> str:
    """Source of a plugin module registering a trivial norm under each of ``names``."""
    regs = "\n".join(
        f"@register('norm', {n!r})\nclass Norm_{n}(Norm):\n"
        f"    def __init__(self, cfg, d_model):\n        super().__init__()\n"
        f"    def forward(self, x, mask=None):\n        return x\n"
        for n in names
    )
    return "import torch\nfrom modforge import register\nfrom modforge.components.norms import Norm\n\n" + regs


def run_python(code: str, *path: Path, cwd: Path = REPO, timeout: int = 300) -> dict:
    """Run ``code`` in a fresh interpreter with ``path`` on PYTHONPATH; return the JSON it prints last."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    env.pop("PYTHONWARNINGS", None)
    proc = python("-c", textwrap.dedent(code), cwd=cwd, env=env, timeout=timeout)  # forked from the warm server
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no RESULT line:\n{proc.stdout}\n{proc.stderr}"
    out = json.loads(lines[-1][len("RESULT "):])
    out["stderr"] = proc.stderr
    return out


# Shared prologue of the subprocess scripts: load everything, recording warnings;
# then helpers that compose + validate + build a tiny model, and that run the CLI.
PROLOGUE = f"""
import contextlib, io, json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from modforge import registry
    from modforge import plugins as builtins
    builtins.load_all()
    builtins.load_all()  # cached: no second warning
    builtins.load_plugins()
plugin_warnings = [str(w.message) for w in caught if "modforge plugin" in str(w.message)]
import torch
from modforge.config import compose
from modforge.models.blocks import Parts
from modforge.train import main
from modforge.config.checks import validate
TINY = {TINY!r}

def build_tiny(*overrides):
    cfg = compose(list(overrides) + TINY)
    validate(cfg)
    model = registry.build("model", cfg.model, Parts.from_config(cfg), 10)
    out = model(torch.randint(0, 10, (1, 5)))
    return bool(torch.isfinite(out).all())

def error_of(fn, *args):
    try:
        fn(*args)
    except registry.ModforgeError as e:
        return [type(e).__name__, str(e)]
    return None

def cli_error(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as e:
            return [e.code, err.getvalue()]
    return [0, err.getvalue()]
"""


@pytest.mark.process  # a fresh interpreter: a registry this process has not loaded
def test_broken_plugin_warns_once_and_builtins_keep_working(tmp_path):
    make_dist(tmp_path, "broken-plugin", "1.2.3", "broken_plugin_mod",
              "raise ImportError('needs libfrobnicate>=2, which is not installed')\n")
    res = run_python(PROLOGUE + """
res = {
    "warnings": plugin_warnings,
    "failed": registry.failed_plugins(),
    "builtins_ok": build_tiny("norm=rms", "ffn=swiglu", "pos=rope") and build_tiny(),
    "extras_loaded": "scale" in registry.registry("norm"),
    "unknown": error_of(compose, ["norm=frobnorm"]),
    "unknown_build": error_of(registry.build, "norm", "frobnorm", 8),
    "cli": cli_error("norm=frobnorm"),
}
print("RESULT " + json.dumps(res))
""", tmp_path)
    # one warning, naming the distribution (and version) and the error
    assert len(res["warnings"]) == 1, res["warnings"]
    warning = res["warnings"][0]
    assert "broken-plugin 1.2.3" in warning and "failed to load" in warning
    assert "ImportError: needs libfrobnicate>=2" in warning
    assert res["failed"] == {"broken-plugin 1.2.3": "ImportError: needs libfrobnicate>=2, which is not installed"}
    # built-ins (and other plugins) unaffected
    assert res["builtins_ok"]
    if EXTRAS_INSTALLED:
        assert res["extras_loaded"]
    # a name nobody provides: the error says which plugin failed and why
    for kind, msg in (res["unknown"], res["unknown_build"]):
        assert kind == "UnknownComponentError"
        assert "Unknown norm 'frobnorm'" in msg
        assert "failed to load" in msg and "broken-plugin 1.2.3" in msg and "libfrobnicate" in msg
    code, stderr = res["cli"]
    assert code == 2 and "broken-plugin 1.2.3" in stderr and "Unknown norm 'frobnorm'" in stderr


@pytest.mark.process  # a fresh interpreter: a registry this process has not loaded
def test_plugin_failing_halfway_leaves_nothing_registered(tmp_path):
    make_dist(tmp_path, "halfway-plugin", "0.1", "halfway_mod",
              norm_plugin("halfnorm") + "\nraise RuntimeError('second half broke')\n")
    res = run_python(PROLOGUE + """
res = {"registered": "halfnorm" in registry.registry("norm"),
       "unknown": error_of(registry.build, "norm", "halfnorm", 8),
       "compose": error_of(compose, ["norm=halfnorm"])}
print("RESULT " + json.dumps(res))
""", tmp_path)
    assert res["registered"] is False
    for kind, msg in (res["unknown"], res["compose"]):
        assert kind == "UnknownComponentError" and "halfway-plugin 0.1" in msg and "second half broke" in msg


@pytest.mark.process  # a fresh interpreter: a registry this process has not loaded
def test_plugin_declaring_a_kind_then_failing_leaves_no_kind_behind(tmp_path):
    """A plugin may declare a kind of its own; if its import then fails, the kind, its options and its default
    go with it, and every run composes as before."""
    make_dist(tmp_path, "mixer-plugin", "0.2", "mixer_mod", """
import torch
from modforge import register
from modforge.registry import declare


class Mixer(torch.nn.Module):
    pass


declare("mixer", "token mixing", base=Mixer, default="identity", part=True)


@register("mixer", "identity")
class Identity(Mixer):
    def __init__(self, cfg, d_model):
        super().__init__()


raise RuntimeError('mixer broke after declaring')
""")
    res = run_python(PROLOGUE + """
res = {"kinds": registry.kinds(), "parts": registry.part_kinds(), "builtins_ok": build_tiny("norm=rms"),
       "failed": registry.failed_plugins()}
print("RESULT " + json.dumps(res))
""", tmp_path)
    assert "mixer" not in res["kinds"] and "mixer" not in res["parts"]
    assert res["builtins_ok"] and "mixer broke after declaring" in res["failed"]["mixer-plugin 0.2"]


@pytest.mark.process  # a fresh interpreter: a registry this process has not loaded
def test_colliding_plugin_names_are_an_error_only_when_used(tmp_path):
    make_dist(tmp_path, "alpha-norms", "0.1.0", "alpha_norms", norm_plugin("twin", "alphaonly"))
    make_dist(tmp_path, "beta-norms", "0.2.0", "beta_norms", norm_plugin("twin"))
    res = run_python(PROLOGUE + """
res = {
    "warnings": plugin_warnings,
    "failed": registry.failed_plugins(),
    "layer_ok": build_tiny("norm=layer"),
    "alphaonly_ok": build_tiny("norm=alphaonly"),
    "alphaonly_provider": registry.get("norm", "alphaonly").provider,
    "compose": error_of(compose, ["norm=twin"]),
    "build": error_of(registry.build, "norm", "twin", 8),
    "cli": cli_error("norm=twin"),
}
print("RESULT " + json.dumps(res))
""", tmp_path)
    assert res["warnings"] == [] and res["failed"] == {}
    assert res["layer_ok"] and res["alphaonly_ok"]
    assert res["alphaonly_provider"] == "alpha-norms 0.1.0"
    for kind, msg in (res["compose"], res["build"]):
        assert kind == "AmbiguousComponentError"
        assert "norm 'twin' is ambiguous" in msg
        assert "alpha-norms 0.1.0" in msg and "beta-norms 0.2.0" in msg
    code, stderr = res["cli"]
    assert code == 2 and "alpha-norms 0.1.0" in stderr and "beta-norms 0.2.0" in stderr


@pytest.mark.process  # a fresh interpreter: a registry this process has not loaded
def test_plugin_reusing_a_builtin_name_never_silently_wins(tmp_path):
    make_dist(tmp_path, "shadow-norms", "0.3.0", "shadow_norms", norm_plugin("layer"))
    res = run_python(PROLOGUE + """
res = {
    "failed": registry.failed_plugins(),
    "rms_ok": build_tiny("norm=rms"),
    "get": error_of(registry.get, "norm", "layer"),
    "compose": error_of(compose, ["norm=layer"]),
    "default_run": error_of(build_tiny),  # train.yaml's default norm is layer
    "layer_providers": [e.provider for e in registry.registry("norm").entries() if e.name == "layer"],
}
print("RESULT " + json.dumps(res))
""", tmp_path)
    assert res["failed"] == {}
    assert res["rms_ok"]
    assert res["layer_providers"] == ["built-in", "shadow-norms 0.3.0"]
    for kind, msg in (res["get"], res["compose"], res["default_run"]):
        assert kind == "AmbiguousComponentError"
        assert "built-in" in msg and "shadow-norms 0.3.0" in msg


@pytest.mark.process  # a fresh interpreter: a registry this process has not loaded
def test_hydra_searchpath_plugin_is_installed(tmp_path):
    """The SearchPathPlugin must be visible to Hydra's scan from anywhere, not only from the repo root
    (it is: once ``hydra_plugins`` and ``hydra_plugins.modforge_searchpath`` are in the packages of
    pyproject.toml and modforge is (re)installed)."""
    res = run_python("""
import json
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
found = [f"{p.__module__}.{p.__name__}" for p in Plugins.instance().discover(SearchPathPlugin)]
print("RESULT " + json.dumps({"found": found}))
""", cwd=tmp_path)
    assert "hydra_plugins.modforge_searchpath.ModforgeSearchPathPlugin" in res["found"], (
        "Hydra does not find hydra_plugins.modforge_searchpath outside the repo root: list 'hydra_plugins' and "
        f"'hydra_plugins.modforge_searchpath' in pyproject's packages and reinstall modforge. Found: {res['found']}"
    )


@pytest.mark.process  # a fresh interpreter: a registry this process has not loaded
@needs_extras
def test_plugin_yaml_preset_is_selectable(tmp_path):
    res = run_python(PROLOGUE + """
cfg = compose(["experiment=extras_small"])
over = compose(["experiment=extras_small", "norm=dyt", "model.d_model=32"])
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = cli_error("experiment=extras_small", "--cfg", "job")
res = {
    "names": [cfg.norm.name, cfg.ffn.name, cfg.pos.name],
    "model": [cfg.model.name, cfg.model.d_model, cfg.model.n_layers],
    "override": [over.norm.name, over.model.d_model],
    "ok": build_tiny("experiment=extras_small"),
    "cli_code": code[0],
    "cli_out": out.getvalue(),
    "config_dirs": registry.plugin_config_dirs(),
}
print("RESULT " + json.dumps(res))
""")
    assert res["names"] == ["scale", "relu2", "alibi"]
    assert res["model"] == ["decoder_only", 64, 2]
    assert res["override"] == ["dyt", 32]  # command-line choices win over the preset
    assert res["ok"]
    assert res["cli_code"] == 0
    printed = yaml.safe_load(res["cli_out"])
    assert [printed[g]["name"] for g in ("norm", "ffn", "pos")] == ["scale", "relu2", "alibi"]
    assert [p for p, _ in res["config_dirs"]] == ["modforge-extras 0.1.0"]


@pytest.mark.slow
@needs_extras
def test_train_with_plugin_components(tmp_path):
    out = tmp_path / "run"
    proc = run_in_process("modforge.train", REPO, "norm=scale", "ffn=relu2", "pos=alibi", "model.d_model=32",
                          "model.n_layers=1", "model.n_heads=2", "trainer.max_steps=5", "trainer.val_check_interval=5",
                          "trainer.limit_val_batches=2", "data.max_chars=20000", f"hydra.run.dir={out}")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    metrics = json.loads((out / "metrics.json").read_text())
    assert math.isfinite(metrics["val"]["val/loss"])
    assert metrics["steps"] == 5
    assert metrics["config"]["norm"] == "scale" and metrics["config"]["ffn"] == "relu2"
    assert metrics["config"]["pos"] == "alibi"
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["norm"] == {"name": "scale", "eps": 1e-5, "g_init": None}
    assert cfg["ffn"] == {"name": "relu2", "bias": False}
    assert cfg["pos"] == {"name": "alibi"}


@pytest.mark.process  # a fresh interpreter: a registry this process has not loaded
def test_discovery_startup_cost_without_plugins(capsys):
    """Measured, not asserted: reading the entry-point group on a fresh registry (built-ins already
    imported). ``entry_points`` is wrapped so the real scan runs but yields nothing, i.e. an
    environment with no plugins installed."""
    res = run_python("""
import importlib.metadata, json, time
from modforge import registry
from modforge import plugins as builtins
t0 = time.perf_counter(); builtins.load_builtins(); t_builtins = time.perf_counter() - t0
real = importlib.metadata.entry_points
installed = [ep.value for ep in real(group=builtins.ENTRY_POINT_GROUP)]
def no_plugins(**kw):
    real(**kw)  # pay the full scan of installed distributions
    return importlib.metadata.EntryPoints(())
builtins.importlib.metadata.entry_points = no_plugins
t0 = time.perf_counter(); builtins.load_plugins(); t_discovery = time.perf_counter() - t0
t0 = time.perf_counter(); builtins.load_plugins(); t_cached = time.perf_counter() - t0
print("RESULT " + json.dumps({"discovery": t_discovery, "cached": t_cached, "builtins": t_builtins,
                              "installed": installed, "failed": registry.failed_plugins()}))
""")
    assert res["failed"] == {}
    with capsys.disabled():
        print(f"\n[plugin discovery, no plugins] load_plugins(): {res['discovery'] * 1e3:.2f} ms; "
              f"cached second call: {res['cached'] * 1e6:.1f} us; (for scale: load_builtins(): "
              f"{res['builtins']:.2f} s; entry points actually installed: {res['installed']})")


@needs_extras
def test_a_plugins_own_check_runs_with_modforges(tmp_path):
    """A plugin's Config.check(run) is called by the same loop as modforge's own: ALiBi's note about one head
    is printed before any work; the same command with two heads has none."""
    one = run_in_process("modforge.train", tmp_path, "pos=alibi", "model.n_heads=1", "model.d_model=16",
                         "model.n_layers=1", "dry_run=true", f"hydra.run.dir={tmp_path / 'a'}")
    two = run_in_process("modforge.train", tmp_path, "pos=alibi", "model.n_heads=2", "model.d_model=16",
                         "model.n_layers=1", "dry_run=true", f"hydra.run.dir={tmp_path / 'b'}")
    assert one.returncode == 0 and "note: pos=alibi with model.n_heads=1" in one.stderr
    assert two.returncode == 0 and "pos=alibi" not in two.stderr


def test_the_config_checks_name_no_option():
    """config/checks.py compares no option's name: every option's own rules are its Config's check()."""
    import re

    from modforge import registry
    from modforge.plugins import load_all

    load_all()
    names = {e.name for k in registry.kinds() for e in registry.registry(k).entries()}
    src = (REPO / "modforge" / "config" / "checks.py").read_text()
    compared = set(re.findall(r"""[!=]=\s*["'](\w+)["']|["'](\w+)["']\s*[!=]=""", src))
    assert not {n for pair in compared for n in pair if n} & names
