"""Fail when the source files of one Rust crate import each other in a circle.

One idea per module reads top-down only if modules depend one way: `a` uses `b`, `b` never
uses `a` (directly or through `c`). A file's dependencies here are the modules named by its
`crate::...` and `super::...` paths outside its `#[cfg(test)] mod tests` (tests may reach
anywhere). A module and the modules inside it do not count as a circle (a parent holds the
state its children share). The check reads the source text; it does not run the compiler.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATE_SOURCES = [*sorted(ROOT.glob("crates/*/src")), ROOT / "python" / "src"]


def module_of(src: Path, file: Path) -> str:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return "::".join(parts)


def related(a: str, b: str) -> bool:
    """One module is the other or holds it."""
    return a == b or a.startswith(b + "::") or b.startswith(a + "::") or not a or not b


def dependencies(src: Path) -> dict[str, set[str]]:
    modules = {module_of(src, f): f for f in src.rglob("*.rs")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, file in modules.items():
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests", file.read_text())[0]
        parent = module.rsplit("::", 1)[0] if "::" in module else ""
        paths = [p.split("::") for p in re.findall(r"crate::((?:[a-z_0-9]+::)*[a-z_0-9]+)", text)]
        paths += [
            (parent.split("::") if parent else []) + p.split("::")
            for p in re.findall(r"super::((?:[a-z_0-9]+::)*[a-z_0-9]+)", text)
        ]
        for parts in paths:
            target = next(
                (
                    "::".join(parts[:k])
                    for k in range(len(parts), 0, -1)
                    if "::".join(parts[:k]) in modules
                ),
                None,
            )
            if target is not None and not related(module, target):
                edges[module].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(edges.get(module, ())):
            if target in path:
                found.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(edges):
        if module not in done:
            visit(module, [module])
    unique: dict[frozenset[str], list[str]] = {}
    for cycle in found:
        unique.setdefault(frozenset(cycle), cycle)
    return list(unique.values())


def main() -> int:
    failed = False
    for src in CRATE_SOURCES:
        for cycle in cycles(dependencies(src)):
            failed = True
            crate = src.parent.relative_to(ROOT)
            print(f"{crate}: modules import each other in a circle: {' -> '.join(cycle)}")
    if failed:
        print("Move what both sides need into one module that neither imports back.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
