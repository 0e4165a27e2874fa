"""The build-info file the launcher writes and the exporter (another user, other container) reads."""

from __future__ import annotations

import stat

import pytest

from glmserve.buildinfo import FIELDS, read_build_info, write_build_info


def test_round_trip_and_world_readable(tmp_path) -> None:
    """The exporter runs as uid 10001 and reads the file the root launcher wrote: 0644, not 0600."""
    path = write_build_info(
        tmp_path / "run" / "build-info.json", {"fp8_gather": "on", "source": "launcher"}
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    info = read_build_info(path)
    assert info is not None and set(info) == set(FIELDS)
    assert info["fp8_gather"] == "on" and info["patch_series"] == ""


def test_missing_file_means_not_started_yet(tmp_path) -> None:
    assert read_build_info(tmp_path / "absent.json") is None


@pytest.mark.parametrize("bad", [{"colour": "red"}, {"fp8_gather": "maybe"}])
def test_bad_fields_are_refused(tmp_path, bad) -> None:
    with pytest.raises(ValueError):
        write_build_info(tmp_path / "b.json", bad)
