"""``package_version`` finds what ``importlib.metadata`` finds, without importing it.

Every layout is checked against ``importlib.metadata`` itself over the same path list.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from magi_code import version
from magi_code.version import _Undecided, _version_from_path, package_version


def _oracle(path: list[str]) -> str | None:
    found = list(importlib.metadata.distributions(name="magi-code", path=path))
    return found[0].version if found else None


def _dist_info(directory: Path, name: str, text: str, filename: str = "METADATA") -> Path:
    info = directory / name
    info.mkdir(parents=True)
    (info / filename).write_text(text)
    return info


def test_the_installed_version_is_the_one_importlib_metadata_reports() -> None:
    assert package_version() == importlib.metadata.version("magi-code")


def test_starting_the_cli_never_imports_importlib_metadata() -> None:
    code = (
        "import sys\n"
        "from magi_code.version import package_version\n"
        "import magi_code.cli\n"
        "print(package_version())\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == [importlib.metadata.version("magi-code"), "False"]


def test_the_first_path_entry_with_metadata_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    second.mkdir()
    _dist_info(
        first,
        "magi_code-1.2.3.dist-info",
        "Metadata-Version: 2.1\nName: magi-code\nVersion: 1.2.3\n",
    )
    _dist_info(second, "magi_code-9.0.dist-info", "Name: magi-code\nVersion: 9.0\n")
    path = [str(tmp_path / "missing"), str(first), str(second)]
    assert _version_from_path(path) == _oracle(path) == "1.2.3"
    path = [str(second), str(first)]
    assert _version_from_path(path) == _oracle(path) == "9.0"


@pytest.mark.parametrize(
    ("name", "filename"),
    [
        ("Magi_Code-2.0.dist-info", "METADATA"),
        ("magi.code-2.0.dist-info", "METADATA"),
        ("magi_code.egg-info", "PKG-INFO"),
        ("magi_code-2.0-py3.11.egg-info", "PKG-INFO"),
    ],
)
def test_name_forms_and_egg_info_directories(tmp_path: Path, name: str, filename: str) -> None:
    _dist_info(tmp_path, name, "Name: magi-code\nVersion: 2.0\n\nVersion: 3.0 (body)\n", filename)
    (tmp_path / "magi_code_extra-5.0.dist-info").mkdir()  # another distribution
    (tmp_path / "magi_code").mkdir()  # the package itself
    path = [str(tmp_path)]
    assert _version_from_path(path) == _oracle(path) == "2.0"


def test_no_metadata_anywhere_is_none(tmp_path: Path) -> None:
    (tmp_path / "other-1.0.dist-info").mkdir()
    assert _version_from_path([str(tmp_path)]) is None
    assert _oracle([str(tmp_path)]) is None


@pytest.mark.parametrize(
    "layout",
    ["two candidates", "no version header", "empty metadata", "egg-info file", "zip archive"],
)
def test_what_the_shortcut_cannot_decide_goes_to_importlib_metadata(
    tmp_path: Path, layout: str
) -> None:
    entry = tmp_path / "entry"
    entry.mkdir()
    if layout == "two candidates":
        _dist_info(entry, "magi_code-1.0.dist-info", "Version: 1.0\n")
        _dist_info(entry, "magi_code-2.0.dist-info", "Version: 2.0\n")
    elif layout == "no version header":
        _dist_info(entry, "magi_code-1.0.dist-info", "Name: magi-code\n")
    elif layout == "empty metadata":
        _dist_info(entry, "magi_code-1.0.dist-info", "")
    elif layout == "egg-info file":
        (entry / "magi_code.egg-info").write_text("Version: 1.0\n")
    else:
        entry = tmp_path / "site.zip"
        with zipfile.ZipFile(entry, "w") as archive:
            archive.writestr("magi_code-4.0.dist-info/METADATA", "Version: 4.0\n")
    with pytest.raises(_Undecided):
        _version_from_path([str(entry)])


def test_an_undecided_path_falls_back_to_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive_path = tmp_path / "site.zip"
    with zipfile.ZipFile(archive_path, "w") as archive:
        archive.writestr(
            "magi_code-4.0.dist-info/METADATA", "Metadata-Version: 2.1\nVersion: 4.0\n"
        )
    monkeypatch.setattr(sys, "path", [str(archive_path), *sys.path])
    version.package_version.cache_clear()
    try:
        assert package_version() == "4.0" == importlib.metadata.version("magi-code")
    finally:
        version.package_version.cache_clear()
