"""Every public function and method of the `forebay` package documents every argument:
`help(forebay.read_parquet)` (and the rest) must tell a user what each parameter does.

A parameter counts as documented when its name appears in the docstring of the function, or
(for a constructor) of the class."""

from __future__ import annotations

import inspect

import pytest

import forebay


def _public_callables():
    for name in forebay.__all__:
        obj = getattr(forebay, name)
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                continue
            yield name, obj.__init__, (obj.__doc__ or "") + (obj.__init__.__doc__ or "")
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not inspect.isfunction(member):
                    continue
                yield f"{name}.{attr}", member, member.__doc__ or ""
            for attr, member in vars(obj).items():
                if isinstance(member, classmethod | staticmethod) and not attr.startswith("_"):
                    func = member.__func__
                    yield f"{name}.{attr}", func, func.__doc__ or ""
        elif callable(obj):
            yield name, obj, obj.__doc__ or ""


CALLABLES = list(_public_callables())


def test_there_are_public_callables():
    assert len(CALLABLES) > 20


@pytest.mark.parametrize(("name", "func", "doc"), CALLABLES, ids=[c[0] for c in CALLABLES])
def test_every_argument_is_documented(name, func, doc):
    if func is object.__init__:
        return
    params = [
        p
        for p in inspect.signature(func).parameters.values()
        if p.name not in ("self", "cls")
        and not p.name.startswith("_")
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if not params:
        return
    assert doc.strip(), f"{name} has no docstring"
    missing = [p.name for p in params if p.name not in doc]
    assert not missing, f"{name}: arguments {missing} are not documented"


def test_cpu_check_names_missing_features():
    from forebay._cpu import missing_features

    modern = "processor: 0\nflags\t\t: fpu pni ssse3 cx16 sse4_1 sse4_2 popcnt avx2\n"
    assert missing_features(modern) == []
    old = "flags\t\t: fpu sse2 pni cx16\n"
    assert missing_features(old) == ["popcnt", "sse4_1", "sse4_2", "ssse3"]
