"""The CPU the extension needs, checked before it is loaded.

The compiled extension targets x86-64-v2 (SSE4.2, POPCNT, SSSE3: every x86-64 CPU since
2009). On an older CPU it would die with SIGILL at some instruction; this check turns that
into an ImportError that says why.
"""

from __future__ import annotations

import platform

# /proc/cpuinfo names of the x86-64-v2 features beyond the x86-64 baseline.
X86_64_V2 = ("cx16", "popcnt", "sse3", "sse4_1", "sse4_2", "ssse3")


def missing_features(cpuinfo: str) -> list[str]:
    """Features of x86-64-v2 absent from the first ``flags`` line of ``cpuinfo``."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            # /proc/cpuinfo calls SSE3 "pni" (Prescott New Instructions).
            if "pni" in flags:
                flags.add("sse3")
            return [f for f in X86_64_V2 if f not in flags]
    return []


def require_cpu_features() -> None:
    if platform.machine() not in ("x86_64", "AMD64"):
        return
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
    except OSError:
        return  # not Linux, or no /proc: nothing to check against
    missing = missing_features(cpuinfo)
    if missing:
        raise ImportError(
            f"forebay needs an x86-64-v2 CPU (SSE4.2, POPCNT, SSSE3: any x86-64 CPU since "
            f"2009); this CPU lacks {', '.join(missing)}"
        )
