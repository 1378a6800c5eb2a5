"""QA-set and evaluation figures. Prints; asserts nothing.

    .venv/bin/python bench/qa_eval.py [--quick] [--model minilm] [--llm none|local-gguf]
        [--only squad,chunking,synthetic] [--json OUT]

--json writes the figures with the arguments, the commit and the date.

1. SQuAD dev as a corpus (paragraphs as documents, real questions): nDCG@10 / recall@5 per mode.
2. Chunking comparison on SQuAD dev articles rebuilt from paragraphs: recall@5 and RetrievalScore per strategy
   (BM25, dense with --chunk-model, and hybrid-rrf) from the span-anchored ground truth, every strategy on the same
   questions and within the answer prompt's character budget, beside the context characters of the top five.
3. Synthetic questions on the shared PDFs: how many survive the filters per 100 chunks, with the
   configured LLM and with the inverse-cloze fallback, with samples.

Data: ../shared/datasets/squad-dev/dev-v1.1.json.gz (sections 1 and 2) and ../shared/datasets/pdfs (section 3); a
section whose data is absent prints a message and is skipped.
"""

from __future__ import annotations

import os
import random
import sys
import time
from datetime import datetime, timezone

import pandas as pd

from bench.lib import cli
from bench.lib.datasets import PDFS, SQUAD, absent, squad_as_beir
from bench.lib.provenance import commit
from bench.lib.results import write
from rag.chunk_sets import update_chunk_set
from rag.chunking import get_chunker, load_strategies
from rag.embedding import load_embedder
from rag.evaluation.beir import load_beir, open_beir_index
from rag.evaluation.loaders import squad_articles
from rag.evaluation.metrics import evaluate_run, run_from_hits
from rag.index.bm25 import BM25Index
from rag.index.qdrant import get_client
from rag.index.sync import sync_collection
from rag.ingest import document_to_row, update_documents
from rag.parsing import ParseSettings
from rag.retrieval import Index, SearchFilter, bm25_ranking, dense_ranking
from rag.retrieval.fusion import convex_combination, reciprocal_rank_fusion
from rag.source import scan_folder
from rag.store import data_dir
from rag.synthetic import SynthSettings, generate_qa

NONE = SearchFilter()


def modes_from(dense: dict, sparse: dict) -> dict[str, dict[str, list[str]]]:
    def ids(ranking) -> list[str]:
        return [c for c, _ in ranking]

    return {
        "bm25": {q: ids(r) for q, r in sparse.items()},
        "dense": {q: ids(r) for q, r in dense.items()},
        "hybrid-rrf": {q: ids(reciprocal_rank_fusion([dense[q], sparse[q]])) for q in dense},
        "hybrid-cc": {q: ids(convex_combination(dense[q], sparse[q], 0.5)) for q in dense},
    }


def squad_corpus(model: str, n_queries: int) -> dict:
    folder = squad_as_beir(data_dir() / "bench" / "squad-beir")
    ds = load_beir(folder, "test")
    index, info = open_beir_index(ds, "dense", model, data_dir() / "beir")
    qids = sorted(ds.queries)
    random.Random(7).shuffle(qids)
    qids = qids[:n_queries]
    dense = {q: dense_ranking(index, ds.queries[q], 100, NONE) for q in qids}
    sparse = {q: bm25_ranking(index, ds.queries[q], 100, NONE) for q in qids}
    qrels = {q: ds.qrels[q] for q in qids}
    out = {}
    print(
        f"  {len(ds.corpus)} paragraphs, {len(qids)} of {len(ds.queries)} questions (seeded sample), "
        f"index {info['index_seconds']}s"
    )
    for mode, run in modes_from(dense, sparse).items():
        mean, _ = evaluate_run(qrels, run_from_hits(run), ["ndcg@10", "recall@5"])
        out[mode] = mean
        print(f"  {mode:12s} nDCG@10 {mean['ndcg@10']:.4f}  recall@5 {mean['recall@5']:.4f}")
    return out


CHUNKING_MODES = ["bm25", "dense", "hybrid-rrf"]


def chunking_comparison(model: str, n_articles: int | None, n_queries: int) -> pd.DataFrame:
    """Every strategy scored by rag.evaluation.retrieval_eval.evaluate_index on the same questions, with its
    defaults: span relevance, the passages a default prompt gets (cut to its character budget), questions no chunk
    holds counted as misses; the context characters the top five cost stand beside the scores."""
    from rag.evaluation.retrieval_eval import evaluate_index

    docs, items = squad_articles(SQUAD, max_articles=n_articles)
    rng = random.Random(11)
    items = rng.sample(items, min(n_queries, len(items)))
    documents = pd.DataFrame([document_to_row(d, "bench") for d in docs])
    embedder = load_embedder(model)
    client = get_client()
    rows = []
    print(f"  {len(docs)} articles, {len(items)} questions; retrieval with bm25, dense ({model}), hybrid-rrf")
    for strategy in load_strategies():
        started = time.perf_counter()
        chunks = update_chunk_set(None, documents, get_chunker(strategy)).chunks
        sync_collection(client, chunks, embedder, strategy=f"squad-{strategy}", model=model)
        index = Index(
            chunks.set_index("chunk_id"),
            BM25Index.build(chunks["chunk_id"].tolist(), chunks["text"].tolist()),
            client,
            f"squad-{strategy}__{model}",
            embedder,
        )
        report = evaluate_index(
            index, items, chunks, strategy=strategy, model=model, modes=CHUNKING_MODES
        ).summary.set_index("mode")
        first = report.iloc[0]
        row = {
            "strategy": strategy,
            "chunks": len(chunks),
            "mean_chars": round(chunks["text"].str.len().mean()),
            "questions": int(first["n_questions"]),
            "without_relevant_chunk": int(first["n_without_relevant_chunk"]),
            "relevance": first["relevance"],
            "max_context_chars": first["max_context_chars"],
        }
        for mode in CHUNKING_MODES:
            for metric in ("recall@5", "retrieval_score", "context_chars@5"):
                row[f"{metric} {mode}"] = float(report.loc[mode, metric])
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        print("  " + "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return pd.DataFrame(rows)


def synthetic_on_pdfs(llm_backend: str, llm_model: str, quick: bool = False) -> dict:
    """Questions per 100 chunks that survive the filters. A quick run asks the LLM about one passage of six
    documents (SmolLM2 takes seconds per question on 2 cores); inverse-cloze always covers every document."""
    from rag.llm import LLMSettings, load_llm

    from rag.ingest import document_from_row

    run = update_documents(scan_folder(PDFS), None, None, ParseSettings())

    docs = [document_from_row(r) for r in run.documents.to_dict("records")]
    n_chunks = len(update_chunk_set(None, run.documents, get_chunker("paragraph")).chunks)
    out = {"documents": len(docs), "paragraph_chunks": n_chunks}
    for label, llm in (
        ("inverse-cloze", None),
        (llm_backend, load_llm(LLMSettings(backend=llm_backend, model=llm_model))),
    ):
        if label == "none":
            continue
        started = time.perf_counter()
        sample = docs[:6] if quick and llm is not None else docs
        result = generate_qa(sample, llm, SynthSettings(passages_per_document=1 if quick and llm is not None else 4))
        out[label] = {
            **result.summary,
            "documents": len(sample),
            "per_100_chunks": round(100 * len(result.items) / max(1, n_chunks), 1) if sample is docs else None,
            "seconds": round(time.perf_counter() - started, 1),
            "samples": result.samples[:6],
        }
        print(
            f"  {label}: {len(result.items)} of {result.attempted} survive "
            f"({out[label]['per_100_chunks']} per 100 paragraph chunks) "
            f"in {out[label]['seconds']}s; rejected: {dict(result.rejected)}"
        )
        for s in result.samples[:4]:
            print(f"    [{s['type']}] {s['question']}  → {s['answer']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    cli.add_quick(parser, help="fewer questions and articles (minutes, not hours)")
    parser.add_argument("--model", default="minilm", help="embedder for the SQuAD corpus figure")
    parser.add_argument(
        "--chunk-model", default="wordllama", help="embedder for the chunking comparison (many chunk sets)"
    )
    parser.add_argument("--llm", default="local-gguf", help="LLM backend for synthetic questions (none to skip)")
    parser.add_argument("--llm-model", default="smollm2")
    cli.add_output(
        parser, flags=("--json",), help="result JSON: the figures with the arguments, the commit and the date"
    )
    parser.add_argument("--only", default="squad,chunking,synthetic", help="comma-separated sections to run")
    args = parser.parse_args(argv)
    results = run(args.quick, set(args.only.split(",")), args.model, args.chunk_model, args.llm, args.llm_model)
    if args.json:
        record = {
            "bench": "bench/qa_eval.py",
            "commit": commit(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "cpu_cores": os.cpu_count(),
            "argv": sys.argv[1:] if argv is None else argv,
            "args": {k: str(v) for k, v in vars(args).items()},
            **results,
        }
        write(record, args.json, indent=2, default=str)
    return 0


def run(
    quick: bool = False,
    only: set[str] | None = None,
    model: str = "minilm",
    chunk_model: str = "wordllama",
    llm: str = "local-gguf",
    llm_model: str = "smollm2",
) -> dict:
    """Every figure of this benchmark (or the sections in `only`), printed as it goes and returned."""
    only = set(only or {"squad", "chunking", "synthetic"})
    on_squad = only & {"squad", "chunking"}
    if on_squad and absent(SQUAD, "SQuAD v1.1 dev"):
        only -= on_squad
    if "synthetic" in only and absent(PDFS, "the shared PDFs"):
        only.discard("synthetic")
    results = {}
    if "squad" in only:
        print("1. SQuAD dev as a corpus")
        results["squad_corpus"] = squad_corpus(model, 500 if quick else 2000)
    if "chunking" in only:
        print("2. chunking comparison on SQuAD articles")
        results["chunking"] = chunking_comparison(chunk_model, 8 if quick else None, 300 if quick else 1500).to_dict(
            "records"
        )
    if "synthetic" in only:
        print("3. synthetic questions on the shared PDFs")
        results["synthetic"] = synthetic_on_pdfs(llm, llm_model, quick)
    return results


if __name__ == "__main__":
    sys.exit(main())
