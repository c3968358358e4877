"""Fail when the dev wheel and the tests would build a shared dependency with different features.

`make test` compiles the dependencies once: maturin builds the dev wheel (forebay-python and
what it needs), then the tests build in the same target directory and reuse it all. Cargo
resolves features per build, so a feature that only the tests' dev-dependencies turn on
(criterion, proptest, ...) gives that crate, and every crate above it up to parquet, a second
build. python/Cargo.toml asks for such features itself; this check names any that drifted.
"""

from __future__ import annotations

import subprocess
import sys

TARGET = "x86_64-unknown-linux-gnu"


def features(*selection: str, edges: str) -> dict[str, set[str]]:
    command = ["cargo", "tree", *selection, "--target", TARGET, "-e", edges]
    out = subprocess.run(
        [*command, "--prefix", "none", "--format", "{p}|{f}", "--color", "never"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        package, sep, feats = line.removesuffix(" (*)").partition("|")
        if sep:
            found.setdefault(package, set()).update(f for f in feats.split(",") if f)
    return found


def main() -> int:
    wheel = features("-p", "forebay-python", edges="normal,build")
    tests = features("--workspace", "--exclude", "forebay-python", edges="normal,build,dev")
    drift = [
        (package, sorted(tests[package] - wheel[package]), sorted(wheel[package] - tests[package]))
        for package in sorted(wheel.keys() & tests.keys())
        if wheel[package] != tests[package]
    ]
    for package, tests_only, wheel_only in drift:
        print(
            f"{package}: features only the tests turn on {tests_only}, only the wheel {wheel_only}",
            file=sys.stderr,
        )
    if drift:
        print(
            "make test would compile these crates (and those above them) twice: ask for the "
            "same features in python/Cargo.toml's build-sharing dependencies.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
