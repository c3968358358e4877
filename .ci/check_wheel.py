"""Check that a built wheel installs on old Linux distributions.

1. `auditwheel show` must report a manylinux tag of glibc <= 2.28 (the oldest distributions
   our users run: Amazon Linux 2 has 2.26, RHEL 8 2.28; we build for 2.17).
2. Every symbol the extension takes from the C library must carry a glibc version no newer
   than the tag. auditwheel only looks at versioned symbols: a function missing from the old
   glibc's headers links as an *unversioned* reference (e.g. `preadv2`, new in 2.26) and the
   import fails on an old system with "undefined symbol". Weak references are fine (the
   standard library checks them at run time), as are Python's own symbols.

Usage: python .ci/check_wheel.py WHEEL
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MAX_GLIBC = (2, 28)


def main(wheel: Path) -> int:
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    print(shown.strip())
    tags = re.findall(r"manylinux_(\d+)_(\d+)_x86_64", " ".join(shown.split()))
    if not tags:
        print(f"FAIL: auditwheel reports no manylinux tag for {wheel.name}")
        return 1
    tag = min((int(a), int(b)) for a, b in tags)
    if tag > MAX_GLIBC:
        print(f"FAIL: manylinux tag needs glibc {tag[0]}.{tag[1]} > {MAX_GLIBC}")
        return 1

    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        libs = [n for n in zf.namelist() if n.endswith(".so")]
        zf.extractall(tmp, libs)
        bad = []
        for lib in libs:
            nm = subprocess.run(
                ["nm", "-D", "--undefined-only", str(Path(tmp) / lib)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for line in nm.splitlines():
                fields = line.split()
                kind, name = fields[-2], fields[-1]
                if kind != "U" or "@" in name or name.startswith(("Py", "_Py")):
                    continue
                bad.append(f"{lib}: {name}")
    if bad:
        print("FAIL: unversioned symbols (absent from the target glibc; call the kernel or")
        print("      check at run time instead):")
        print("\n".join(f"  {b}" for b in bad))
        return 1
    print(f"OK: {wheel.name} installs on glibc >= {tag[0]}.{tag[1]}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
