"""Parse throughput against raw pdfplumber, and chunk statistics per strategy, on the shared corpus.

Prints figures; asserts nothing. Usage: .venv/bin/python bench/parse_throughput.py [--repeat N]
Both sides are measured in the same run, alternating, and compared by the ratio of medians.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import pdfplumber

from bench.lib import cli
from bench.lib.datasets import PDFS, absent, parser_files
from rag.chunking import get_chunker, load_strategies
from rag.parsing import ParseError, parse_file


def raw_pdfplumber(paths: list[Path]) -> float:
    started = time.perf_counter()
    for path in paths:
        with pdfplumber.open(path) as pdf:
            for page in pdf.pages:
                page.extract_text()
    return time.perf_counter() - started


def run(repeat: int = 3) -> dict:
    """Every figure of this benchmark, printed as it goes and returned."""
    if absent(PDFS, "the shared PDFs and mixed documents"):
        return {}
    files = parser_files()
    outcomes: Counter[str] = Counter()
    docs = []
    for path in files:
        try:
            docs.append(parse_file(path, doc_id=path.name))
            outcomes["parsed"] += 1
        except ParseError as exc:
            outcomes[f"quarantined: {exc.reason.value}"] += 1
            print(f"  quarantined {path.name}: {exc.reason.value} ({exc.message})")
    print(f"\n{len(files)} shared files: " + ", ".join(f"{v} {k}" for k, v in sorted(outcomes.items())))

    # Throughput on the PDFs both sides can open (the encrypted one cannot be read without its password).
    pdfs = [p for p in sorted(PDFS.glob("*.pdf")) if p.name != "password-example.pdf"]
    pages = 0
    for p in pdfs:
        with pdfplumber.open(p) as pdf:
            pages += len(pdf.pages)
    raw_times, our_times = [], []
    for _ in range(repeat):
        raw_times.append(raw_pdfplumber(pdfs))
        t = time.perf_counter()
        for p in pdfs:
            try:
                parse_file(p, doc_id=p.name)
            except ParseError:
                pass
        our_times.append(time.perf_counter() - t)
    raw_med, our_med = statistics.median(raw_times), statistics.median(our_times)
    result = {
        "files": dict(outcomes),
        "pdfs": len(pdfs),
        "pages": pages,
        "raw_pages_per_s": pages / raw_med,
        "ours_pages_per_s": pages / our_med,
        "ratio": raw_med / our_med,
        "chunking": {},
    }
    print(f"\nparse throughput on {len(pdfs)} PDFs / {pages} pages (median of {repeat}):")
    print(f"  raw pdfplumber extract_text: {result['raw_pages_per_s']:7.1f} pages/s")
    print(f"  rag parse_file (layout, tables, headings): {result['ours_pages_per_s']:7.1f} pages/s")
    print(f"  ratio ours/raw: {result['ratio']:.2f}")

    shared_pdf_docs = [d for d in docs if d.doc_id.endswith(".pdf")]
    print(f"\nchunks per strategy on the {len(shared_pdf_docs)} parsed shared PDFs:")
    print(f"  {'strategy':24s} {'chunks':>7s} {'mean chars':>10s} {'mean tokens':>11s} {'seconds':>8s}")
    for name in load_strategies():
        chunker = get_chunker(name)
        t = time.perf_counter()
        chunks = [c for d in shared_pdf_docs for c in chunker.chunk(d)]
        seconds = time.perf_counter() - t
        mean_chars = statistics.mean(len(c.text) for c in chunks) if chunks else 0
        mean_tokens = statistics.mean(c.n_tokens for c in chunks) if chunks else 0
        result["chunking"][name] = {
            "chunks": len(chunks),
            "mean_chars": mean_chars,
            "mean_tokens": mean_tokens,
            "seconds": seconds,
        }
        print(f"  {name:24s} {len(chunks):7d} {mean_chars:10.0f} {mean_tokens:11.0f} {seconds:8.2f}")
    return result


def main() -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    run(parser.parse_args().repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
