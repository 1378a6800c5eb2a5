"""Where the benchmarks' data sets live, and the one way a script says that one is absent.

They sit outside the repository, in the shared folder beside it (../shared/datasets): SciFact in BEIR layout
(corpus.jsonl, queries.jsonl, qrels/{train,test}.tsv), SQuAD v1.1 dev (dev-v1.1.json.gz), and the parser
benches' real files (pdfs/, docs-mixed/).
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
SHARED = REPO.parent / "shared" / "datasets"
SCIFACT = SHARED / "scifact"
SQUAD = SHARED / "squad-dev" / "dev-v1.1.json.gz"
PDFS = SHARED / "pdfs"
DOCS_MIXED = SHARED / "docs-mixed"  # office, HTML and text files beside the PDFs


def scifact_absent(folder: Path = SCIFACT) -> bool:
    """True (and says so) when `folder` holds no SciFact corpus: the caller has nothing to measure."""
    return absent(folder / "corpus.jsonl", "SciFact in BEIR layout: corpus.jsonl, queries.jsonl, qrels/test.tsv")


def absent(needed: Path, what: str) -> bool:
    """True (and says what is missing and where it was looked for) when `needed` does not exist."""
    if needed.exists():
        return False
    print(f"skipped: {needed} is absent ({what} is needed; put it there to measure)")
    return True


def parser_files() -> list[Path]:
    """The real files the parser benches read: every shared PDF, then every mixed document (its manifest aside);
    empty when the shared PDFs are absent."""
    if not PDFS.is_dir():
        return []
    return sorted(PDFS.glob("*.pdf")) + sorted(p for p in DOCS_MIXED.iterdir() if p.name != "manifest.json")


def squad_as_beir(folder: Path) -> Path:
    """SQuAD dev paragraphs as a BEIR corpus, its questions as queries (written once)."""
    if (folder / "qrels" / "test.tsv").exists():
        return folder
    from rag.evaluation.qaset import import_squad

    documents, items = import_squad(SQUAD)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as fh:
        for doc_id, text in documents.items():
            fh.write(json.dumps({"_id": doc_id, "title": "", "text": text}) + "\n")
    with open(folder / "queries.jsonl", "w") as fh:
        for item in items:
            fh.write(json.dumps({"_id": item.qid, "text": item.question}) + "\n")
    with open(folder / "qrels" / "test.tsv", "w") as fh:
        fh.write("query-id\tcorpus-id\tscore\n" + "".join(f"{i.qid}\t{i.doc_id}\t1\n" for i in items))
    return folder
