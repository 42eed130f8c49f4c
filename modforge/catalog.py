"""``python -m modforge list [KIND [NAME]]``: what can be chosen, where it lives, and its defaults.

  python -m modforge list                 every kind, its options, their providers, module and class, default parameters;
                                        then the experiment and trainer options (YAML presets)
  python -m modforge list norm ffn        only these kinds (or: experiment, trainer)
  python -m modforge list norm rms        one component: its whole docstring and its parameters
  python -m modforge list experiment shakespeare_char   one preset: where it lives and its YAML
"""
import importlib.resources
import inspect
from pathlib import Path
from typing import Optional

from modforge import registry
from modforge.plugins import load_all
from modforge.cli.command import command
from modforge.config.command_line import check_preset
from modforge.config.composition import hydra_loader
from modforge.config.schema import PRESET_GROUPS



def _kind_header(kind: str, k: dict) -> str:
    how = f"chosen with {k['nested_in']}=NAME" if k["nested_in"] else f"{kind}=NAME"
    default = f", default {k['default']}" if k["default"] else ""
    base = f", base {k['base']}" if k["base"] else ""
    return f"{kind}: {k['doc']} ({how}{default}{base})"


def render_kind(kind: str, k: dict) -> list[str]:
    """One kind, from the registry's data (:mod:`modforge.cli.manifest`: the same with or without torch loaded)."""
    lines = [_kind_header(kind, k)]
    for e in k["entries"]:
        ambiguous = "  [AMBIGUOUS]" if e["ambiguous"] else ""
        lines.append(f"  {e['name']:<16} [{e['provider']}]{ambiguous}  {e['doc']}")
        lines.append(f"  {'':<16} {e['class']}" + (f"; {e['params_text']}" if e["params_text"] else ""))
    return lines


def render_preset(group: str, name: str) -> str:
    """One preset: who provides it, where it lives, and its YAML as written (comments included)."""
    import yaml

    from modforge.utils.readers import yaml_error

    with hydra_loader() as loader:
        check_preset(group, [name], loader)
        try:
            found = loader.repository.load_config(f"{group}/{name}")
        except yaml.YAMLError as e:
            raise registry.ConfigError(f"{group}={name}: {yaml_error(e)}") from None
    where = found.path
    if where.startswith("file://"):
        path = Path(where[len("file://"):]) / group / f"{name}.yaml"
        text = path.read_text(encoding="utf-8")
    else:  # pkg://package.conf
        path = f"{where}/{group}/{name}.yaml"
        text = importlib.resources.files(where[len("pkg://"):]).joinpath(f"{group}/{name}.yaml").read_text("utf-8")
    provider = "modforge" if found.provider == "main" else found.provider
    return f"{group} {name}  [{provider}]  {path}\n\n{text.rstrip()}"


def render_presets(group: str, data: dict) -> list[str]:
    from modforge.cli import manifest

    return [f"{group}: {PRESET_GROUPS[group]} ({group}=NAME)"] + [f"  {o}" for o in manifest.preset_options(data, group)]


def render_one(kind: str, name: str) -> str:
    e = registry.get(kind, name)
    lines = [f"{kind} {e.name}  [{e.provider}]  {registry._qualname(e.cls)}", ""]
    lines += [inspect.cleandoc(e.cls.__doc__ or "(no docstring)"), ""]
    params = e.default_params()
    lines.append("parameters (" + (f"{kind}.KEY=VALUE" if registry.kind(kind).top_level else "config keys") + "):")
    lines += [f"  {k} = {v!r}" for k, v in params.items()] or ["  none"]
    if e.defaults:
        lines.append("selects by default: " + ", ".join(f"{g}={v}" for g, v in e.defaults.items()))
    return "\n".join(lines)


def render(kinds: Optional[list] = None, data: Optional[dict] = None) -> str:
    """Every kind (or those named) and the preset groups, from the cached manifest when it is current (no
    torch), else from the registry loaded now."""
    from modforge.cli import manifest

    data = data or manifest.read() or manifest.of_registry()
    lines: list[str] = []
    for kind in kinds or [*data["kinds"], *PRESET_GROUPS]:
        lines += render_presets(kind, data) if kind in PRESET_GROUPS else render_kind(kind, data["kinds"][kind])
    failed = data.get("failed") or {}
    if failed:
        lines.append("plugins that failed to load:")
        lines += [f"  {d}: {err}" for d, err in failed.items()]
    return "\n".join(lines)


def list_command(argv: list) -> None:
    from modforge.cli import manifest

    data = manifest.read() or manifest.of_registry()
    if len(argv) == 2 and argv[1] not in [*data["kinds"], *PRESET_GROUPS]:
        load_all()  # one component's whole docstring: its class
        print(render_preset(*argv) if argv[0] in PRESET_GROUPS else render_one(*argv))
        return
    for a in argv:
        if a not in PRESET_GROUPS and a not in data["kinds"]:
            known = [*data["kinds"], *PRESET_GROUPS]
            raise registry.ConfigError(f"Unknown kind '{a}'.{registry.suggest(a, known)} Kinds: {', '.join(known)}.")
    print(render(argv or None, data))


def main(argv: Optional[list] = None) -> None:
    command(__doc__, list_command, argv)


if __name__ == "__main__":
    main()
