"""``python -m modforge.list [KIND ...]``: every kind, its options, their providers and default parameters."""
import sys
from typing import Optional

from modforge import registry


def render(kinds: Optional[list] = None) -> str:
    registry.load_all()
    lines = []
    for kind in kinds or registry.kinds():
        reg = registry.registry(kind)
        lines.append(f"{kind}: {reg.doc}")
        for e in reg.entries():
            params = ", ".join(f"{k}={v!r}" for k, v in e.default_params().items())
            ambiguous = "  [AMBIGUOUS]" if len(reg._entries[e.name]) > 1 else ""
            lines.append(f"  {e.name:<16} [{e.provider}]{ambiguous}  {e.doc}")
            if params:
                lines.append(f"  {'':<16} {params}")
    failed = registry.failed_plugins()
    if failed:
        lines.append("plugins that failed to load:")
        lines += [f"  {d}: {err}" for d, err in failed.items()]
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        print(render(argv or None))
    except registry.ModforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
