"""forebay.SpillArea from Python: byte-exact round trips (preadv and mapped), corruption and
truncation reported as SpillError naming the file and offset, file lifetime and stats."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import forebay


def payload(seed: int, n: int) -> bytes:
    return bytes((seed * 31 + i * 7) % 256 for i in range(n))


@pytest.mark.parametrize("sync", ["none", "file", "object"])
def test_round_trip_many_sizes(tmp_path, sync):
    area = forebay.SpillArea(tmp_path, sync=sync)
    objects = [[], [b""], [payload(1, 1), payload(2, 63), payload(3, 65)], [payload(4, 300_000)]]
    locations = area.spill(objects, ids=[10, 11, 12, 13])
    assert len({loc.path() for loc in locations}) == 1
    for loc, obj, oid in zip(locations, objects, [10, 11, 12, 13], strict=True):
        assert loc.object_id() == oid
        assert loc.buffer_lens() == [len(b) for b in obj]
        assert area.restore(loc) == obj
        mapped = area.restore_mapped(loc)
        assert [m.buffers()[1].to_pybytes() if len(m) else b"" for m in mapped] == obj
    s = area.stats()
    assert s["objects_spilled"] == 4 and s["objects_restored"] == 8


def test_corruption_and_truncation_name_file_and_offset(tmp_path):
    area = forebay.SpillArea(str(tmp_path))
    locations = area.spill([[payload(1, 1000)], [payload(2, 500)]])
    path = Path(locations[1].path())
    data = bytearray(path.read_bytes())
    off = locations[1].offset()
    data[off + 200] ^= 0xFF  # a payload byte of the second object
    path.write_bytes(bytes(data))
    assert area.restore(locations[0]) == [payload(1, 1000)]
    for restore in (area.restore, area.restore_mapped):
        with pytest.raises(forebay.SpillError, match=rf"{path}.*offset {off}.*checksum"):
            restore(locations[1])
    os.truncate(path, off + 100)
    with pytest.raises(forebay.SpillError, match=rf"truncated.*offset {off}"):
        area.restore(locations[1])
    assert issubclass(forebay.SpillError, forebay.ForebayError)


def test_file_deleted_when_every_object_freed(tmp_path):
    area = forebay.SpillArea([tmp_path / "a", tmp_path / "b"])
    first, second = area.spill([[b"x" * 10], [b"y" * 20]])
    path = Path(first.path())
    first.free()
    assert path.exists()
    second.free()
    assert not path.exists()
    with pytest.raises(forebay.SpillError, match="freed"):
        area.restore(second)
    assert area.stats()["files_deleted"] == 1
    assert oct((tmp_path / "a").stat().st_mode & 0o777) == "0o700"
    with pytest.raises(forebay.SpillError, match="sync"):
        forebay.SpillArea(tmp_path, sync="sometimes")
