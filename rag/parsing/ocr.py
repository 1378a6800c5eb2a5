"""OCR for PDF pages without a text layer: the page is rendered to an image and read by Tesseract.

Tesseract runs as a subprocess (Debian's `tesseract-ocr` + a `tesseract-ocr-<lang>` data package), one page at a
time and single-threaded: on a busy machine its OpenMP threads spin against each other and a page takes about four
times longer than with one thread.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from statistics import mean

# Renders larger than this many pixels are made at a lower resolution (a poster-sized page at 300 dpi would
# need gigabytes of memory).
MAX_PIXELS = 50_000_000
INSTALL_HINT = "apt-get install tesseract-ocr tesseract-ocr-eng (`make install` does it when run as root or with sudo)"


class OcrUnavailable(Exception):
    """Tesseract or the requested language data is not installed; the message says how to install it."""


@dataclass(frozen=True)
class OcrParagraph:
    text: str  # lines joined by "\n", words by " "
    confidence: float  # Tesseract's mean word confidence, 0-100


def tesseract_path() -> str | None:
    return shutil.which("tesseract")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_THREAD_LIMIT": os.environ.get("OMP_THREAD_LIMIT", "1")}


@lru_cache(maxsize=4)
def _engine(path: str | None) -> tuple[str, frozenset[str]]:
    if path is None:
        return "", frozenset()
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, env=_env())
    first = (version.stdout or version.stderr).strip().splitlines()
    langs = subprocess.run([path, "--list-langs"], capture_output=True, text=True, timeout=30, env=_env())
    # The first line is a header ("List of available languages in ...").
    names = frozenset(ln.strip() for ln in langs.stdout.splitlines()[1:] if ln.strip())
    return (first[0] if first else "tesseract"), names


def engine_id() -> str:
    """Tesseract's version and installed languages, or "missing": part of the parse-settings fingerprint, so
    installing or upgrading Tesseract re-parses documents (and retries those quarantined for lack of it)."""
    version, langs = _engine(tesseract_path())
    return f"{version} [{','.join(sorted(langs))}]" if version else "missing"


def check_available(language: str) -> str:
    """The engine's version string; raises OcrUnavailable naming what to install."""
    version, langs = _engine(tesseract_path())
    if not version:
        raise OcrUnavailable(f"the tesseract program is not installed: {INSTALL_HINT}")
    missing = [lang for lang in language.split("+") if lang not in langs]
    if missing:
        packages = " ".join("tesseract-ocr-" + lang.lower().replace("_", "-") for lang in missing)
        raise OcrUnavailable(f"tesseract has no language data for {'+'.join(missing)}: apt-get install {packages}")
    return version


def available(language: str = "eng") -> bool:
    try:
        check_available(language)
    except OcrUnavailable:
        return False
    return True


def render_page(page, dpi: int):
    """The page as a greyscale PIL image at `dpi` (lowered for huge pages) and the resolution used."""
    width_in, height_in = float(page.width) / 72, float(page.height) / 72
    limit = (MAX_PIXELS / max(width_in * height_in, 1e-6)) ** 0.5
    resolution = max(1, int(min(dpi, limit)))
    image = page.to_image(resolution=resolution, antialias=True).original
    return image.convert("L"), resolution


def parse_tsv(tsv: str) -> list[OcrParagraph]:
    """Tesseract's TSV output as paragraphs in its reading order (blocks, then paragraphs, then lines)."""
    paragraphs: dict[tuple[str, str, str], dict[str, list]] = {}
    for row in csv.DictReader(io.StringIO(tsv), delimiter="\t", quoting=csv.QUOTE_NONE):
        text = (row.get("text") or "").strip()
        if row.get("level") != "5" or not text:
            continue
        key = (row["page_num"], row["block_num"], row["par_num"])
        par = paragraphs.setdefault(key, {"lines": [], "line_ids": [], "conf": []})
        if not par["line_ids"] or par["line_ids"][-1] != row["line_num"]:
            par["line_ids"].append(row["line_num"])
            par["lines"].append([])
        par["lines"][-1].append(text)
        par["conf"].append(float(row["conf"]))
    out = []
    for par in paragraphs.values():
        text = "\n".join(" ".join(words) for words in par["lines"])
        if any(ch.isalnum() for ch in text):  # specks and rules read as "|", "_", "—"
            out.append(OcrParagraph(text, round(mean(par["conf"]), 1)))
    return out


def ocr_image(image, *, language: str, dpi: int, timeout_s: float) -> list[OcrParagraph]:
    """Run Tesseract on one image. Raises subprocess.TimeoutExpired or RuntimeError (its stderr) on failure."""
    path = tesseract_path()
    if path is None:
        raise OcrUnavailable(f"the tesseract program is not installed: {INSTALL_HINT}")
    png = io.BytesIO()
    image.save(png, format="PNG")
    proc = subprocess.run(
        [path, "stdin", "stdout", "-l", language, "--dpi", str(dpi), "tsv"],
        input=png.getvalue(),
        capture_output=True,
        timeout=timeout_s,
        env=_env(),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"tesseract exited with {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]}")
    return parse_tsv(proc.stdout.decode("utf-8", errors="replace"))
