import hashlib

import pytest

from rag.source import resolve_inside, scan_folder


def test_doc_ids_are_relative_posix_paths_with_content_hashes(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.txt").write_text("hello")
    (tmp_path / "top.md").write_text("# t")
    (tmp_path / ".hidden").write_text("skip me")
    scan = scan_folder(tmp_path)
    assert [f.doc_id for f in scan.files] == ["a/b/x.txt", "top.md"]
    assert scan.files[0].content_hash == hashlib.sha256(b"hello").hexdigest()


def test_symlinks_escaping_the_root_are_rejected(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "inside.txt").write_text("ok")
    (root / "leak.txt").symlink_to(outside / "secret.txt")
    (root / "alias.txt").symlink_to(root / "inside.txt")
    scan = scan_folder(root)
    assert sorted(f.doc_id for f in scan.files) == ["alias.txt", "inside.txt"]
    assert [r.doc_id for r in scan.rejected] == ["leak.txt"]
    with pytest.raises(ValueError):
        resolve_inside(root, "../outside/secret.txt")
