"""Version detection reads files only, and refuses to guess when the sources disagree."""

from __future__ import annotations

from pathlib import Path

import pytest

from glmserve.series import PatchError, detect_version


def make(site: Path, *, dist: dict[str, str] | None = None, version_py: str | None = None) -> Path:
    (site / "sglang").mkdir(parents=True)
    for dirname, text in (dist or {}).items():
        (site / dirname).mkdir()
        name = "PKG-INFO" if dirname.endswith(".egg-info") else "METADATA"
        (site / dirname / name).write_text(text)
    if version_py is not None:
        (site / "sglang" / "_version.py").write_text(version_py)
    return site


def meta(name: str, version: str) -> str:
    return f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n\nlong description\n"


def test_dist_info_metadata(tmp_path):
    site = make(tmp_path, dist={"sglang-0.5.11.dist-info": meta("sglang", "0.5.11")})
    assert detect_version(site) == "0.5.11"


def test_other_distributions_are_ignored(tmp_path):
    site = make(
        tmp_path,
        dist={
            "sglang_router-0.3.2.dist-info": meta("sglang-router", "0.3.2"),
            "sglang-0.5.10.post1.dist-info": meta("sglang", "0.5.10.post1"),
            "torch-2.11.0.dist-info": meta("torch", "2.11.0"),
        },
    )
    assert detect_version(site) == "0.5.10.post1"


def test_version_module_when_there_is_no_metadata(tmp_path):
    """Editable/source installs: setuptools-scm's generated sglang/_version.py."""
    site = make(tmp_path, version_py="__version__ = version = '0.5.12.post1'\n")
    assert detect_version(site) == "0.5.12.post1"


def test_literal_in_version_py_of_older_releases(tmp_path):
    site = make(tmp_path)
    (site / "sglang" / "version.py").write_text('__version__ = "0.4.6.post5"\n')
    assert detect_version(site) == "0.4.6.post5"


def test_disagreement_is_an_error(tmp_path):
    site = make(
        tmp_path,
        dist={"sglang-0.5.12.dist-info": meta("sglang", "0.5.12")},
        version_py="__version__ = '0.5.11'\n",
    )
    with pytest.raises(
        PatchError, match=r"metadata says 0\.5\.12 but sglang/_version\.py says 0\.5\.11"
    ):
        detect_version(site)


def test_two_installs_is_an_error(tmp_path):
    site = make(
        tmp_path,
        dist={
            "sglang-0.5.9.dist-info": meta("sglang", "0.5.9"),
            "sglang-0.5.11.dist-info": meta("sglang", "0.5.11"),
        },
    )
    with pytest.raises(PatchError, match="several SGLang installs"):
        detect_version(site)


def test_no_package_and_no_version(tmp_path):
    with pytest.raises(PatchError, match="no sglang/ package directory"):
        detect_version(tmp_path)
    with pytest.raises(PatchError, match="cannot determine the SGLang version"):
        detect_version(make(tmp_path / "x"))


def test_the_package_dir_itself_gets_a_hint_to_pass_its_parent(tmp_path):
    pkg = tmp_path / "site-packages" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    with pytest.raises(PatchError) as err:
        detect_version(pkg)
    assert str(err.value) == (
        f"no sglang/ package directory in {pkg}; {pkg} is the package itself: pass its parent, "
        f"--target {pkg.parent}"
    )


def test_one_reader_for_every_installed_version_dist_info_and_egg_info(tmp_path):
    """series.detect.dist_versions is the one reader: the patch tool's SGLang version and
    sglang_lines' GPU-stack pins both go through it, so egg-info counts for both (two readers
    once disagreed on it)."""
    from glmserve.series.detect import dist_versions
    from glmserve.sglang_lines import DEFAULT_LINE, get, site_problems

    line = get(DEFAULT_LINE)
    site = make(
        tmp_path,
        dist={
            f"sglang-{line.version}.dist-info": meta("sglang", line.version),
            f"torch-{line.torch}.egg-info": meta("torch", line.torch + "+cu130"),
            "flashinfer_python-0.0.1.dist-info": meta("flashinfer-python", "0.0.1"),
            "sglang_router-0.3.2.dist-info": meta("sglang-router", "0.3.2"),
        },
    )
    assert dist_versions(site, "sglang") == [line.version]
    assert dist_versions(site, "torch") == [line.torch + "+cu130"]
    assert dist_versions(site, "sglang-router") == dist_versions(site, "sglang_router") == ["0.3.2"]
    assert detect_version(site) == line.version
    problems = site_problems(site, DEFAULT_LINE, gpu_stack_required=False)
    assert problems == [
        f"the base holds flashinfer-python 0.0.1, SGLang {line.version} pins {line.flashinfer}"
    ]  # torch read from its egg-info, and accepted with its local build tag
