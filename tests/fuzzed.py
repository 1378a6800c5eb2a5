"""Bad input files generated on the fly (never committed): each must end in quarantine, not a crash."""

from __future__ import annotations

import io
import os
from pathlib import Path

from pypdf import PdfWriter


def make_bad_files(folder: Path, real_pdf: Path) -> dict[str, str]:
    """Write the files and return {relative path: expected quarantine reason}."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = {}
    (folder / "empty.pdf").write_bytes(b"")
    expected["empty.pdf"] = "empty"
    (folder / "empty.txt").write_bytes(b"")
    expected["empty.txt"] = "empty"
    data = real_pdf.read_bytes()
    (folder / "truncated.pdf").write_bytes(data[: len(data) // 3])
    expected["truncated.pdf"] = "malformed"
    (folder / "random.pdf").write_bytes(os.urandom(4096))
    expected["random.pdf"] = "malformed"
    (folder / "binary.xyz").write_bytes(os.urandom(128))
    expected["binary.xyz"] = "unsupported"
    writer = PdfWriter()
    for _ in range(2000):
        writer.add_blank_page(width=200, height=200)
    buf = io.BytesIO()
    writer.write(buf)
    (folder / "2000-pages.pdf").write_bytes(buf.getvalue())
    expected["2000-pages.pdf"] = "too-large"
    return expected


def write_invalid_utf8(path: Path) -> None:
    # Latin-1 bytes that are not valid UTF-8 inside otherwise ordinary English text.
    path.write_bytes("Caf\xe9 menu: cr\xe8me br\xfbl\xe9e and na\xefve coffee. ".encode("latin-1") * 20)
