"""The build digest: a hash of the package's files, reused only while their stats hold.

``build_id`` hashes every file of the installed package; ``package_digest`` keeps the
result in ``__pycache__/build-id`` beside the files' stat signature, so a start whose
files are unchanged reads one small file instead. Each check runs on a real directory.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from magi_code import version
from magi_code.version import package_digest


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("A = 1\n")
    (root / "sub" / "b.py").write_text("B = 2\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"ignored")
    return root


def _full_hash(root: Path) -> str:
    """The digest as every start computed it before the cache: paths, sizes, contents."""
    digest = hashlib.sha256()
    for relative in ("a.py", os.path.join("sub", "b.py")):
        data = (root / relative).read_bytes()
        digest.update(relative.encode() + b"\0%d\0" % len(data) + data)
    return digest.hexdigest()


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test count as settled (not changed within the last 2 s)."""
    monkeypatch.setattr(version, "_RACY_NS", 0)


def _cache(root: Path) -> Path:
    return root / "__pycache__" / "build-id"


def test_the_digest_is_of_paths_and_contents_and_byte_caches_do_not_count(
    tmp_path: Path,
) -> None:
    root = _tree(tmp_path / "pkg")
    assert package_digest(str(root)) == _full_hash(root)
    (root / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"other")
    assert package_digest(str(root)) == _full_hash(root)


@pytest.mark.usefixtures("settled")
def test_an_unchanged_tree_is_answered_from_the_cache(tmp_path: Path) -> None:
    root = _tree(tmp_path / "pkg")
    digest = package_digest(str(root))
    cached, _, _signature = _cache(root).read_bytes().partition(b"\n")
    assert cached.decode() == digest
    # The cache alone answers now: a planted digest for the same signature comes back.
    planted = "f" * 64
    _cache(root).write_bytes(planted.encode() + b"\n" + _signature)
    assert package_digest(str(root)) == planted


@pytest.mark.usefixtures("settled")
def test_an_edit_of_the_same_size_with_the_old_mtime_changes_the_digest(
    tmp_path: Path,
) -> None:
    root = _tree(tmp_path / "pkg")
    before = package_digest(str(root))
    st = os.stat(root / "a.py")
    (root / "a.py").write_text("A = 3\n")
    os.utime(root / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))  # ctime still moves
    after = package_digest(str(root))
    assert after != before and after == _full_hash(root)


@pytest.mark.usefixtures("settled")
def test_a_new_file_and_a_copy_of_the_tree_are_hashed_again(tmp_path: Path) -> None:
    root = _tree(tmp_path / "pkg")
    before = package_digest(str(root))
    (root / "c.py").write_text("")
    assert package_digest(str(root)) != before
    (root / "c.py").unlink()
    copy = tmp_path / "copy"
    copy.mkdir()
    for relative in ("a.py", "sub"):
        os.rename(root / relative, copy / relative)
    # Same files, new inodes: the same digest, from the files themselves.
    assert package_digest(str(copy)) == before


def test_files_changed_within_the_last_seconds_are_not_cached(tmp_path: Path) -> None:
    root = _tree(tmp_path / "pkg")
    assert package_digest(str(root)) == _full_hash(root)
    assert not _cache(root).exists()


@pytest.mark.usefixtures("settled")
def test_an_unwritable_cache_only_costs_the_hashing(tmp_path: Path) -> None:
    root = _tree(tmp_path / "pkg")
    _cache(root).mkdir()  # neither readable nor replaceable as a file
    assert package_digest(str(root)) == _full_hash(root) == package_digest(str(root))
    # (no temporary file left behind)
    assert sorted(os.listdir(root / "__pycache__")) == ["a.cpython-311.pyc", "build-id"]
