"""Fail when the reader-only build of forebay pulls in what it must leave out.

`forebay` with `default-features = false` is what a host engine embeds to read Parquet: the
reader (forebay-parquet) and forebay-io, with local files and stores the host builds. It must
not bring the engine, the object store, spill files, the checkpoint, a progress bar, or any
HTTP client, TLS stack or cloud SDK (issue 40). `cargo tree` resolves it without compiling.
"""

from __future__ import annotations

import subprocess
import sys

TARGET = "x86_64-unknown-linux-gnu"
# Crates (by name prefix) that have no place in a reader-only build.
FORBIDDEN = (
    "forebay-engine",
    "forebay-store",
    "forebay-spill",
    "forebay-checkpoint",
    "indicatif",
    "reqwest",
    "hyper",
    "rustls",
    "ring",
    "quick-xml",
    "aws-",
    "google-",
    "azure_",
)


def crates(*selection: str) -> set[str]:
    tree = ["cargo", "tree", *selection, "--target", TARGET, "-e", "normal"]
    out = subprocess.run(
        [*tree, "--prefix", "none", "--format", "{p}", "--color", "never"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def main() -> int:
    failed = False
    for selection in (
        ("-p", "forebay", "--no-default-features"),
        ("-p", "forebay-parquet", "--no-default-features"),
    ):
        found = sorted(c for c in crates(*selection) if c.startswith(FORBIDDEN))
        if found:
            failed = True
            print(f"cargo tree {' '.join(selection)} pulls in: {', '.join(found)}", file=sys.stderr)
    # With its defaults the reader does read object stores.
    if not any(c.startswith("reqwest") for c in crates("-p", "forebay-parquet")):
        failed = True
        print("forebay-parquet's default build has no object-store backends", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
