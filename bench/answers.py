"""Answer figures: SQuAD dev questions over the SQuAD paragraphs as a corpus, answered by the extractive generator
and by SmolLM2 (local-gguf) for every retrieval mode plus the no-retrieval baseline; EM / F1 / ROUGE-L, answer
accuracy, source accuracy, coverage, latency. Then a small table-QA check on the sample corpus. Prints; asserts nothing.

    .venv/bin/python bench/answers.py [--questions 300] [--llm-questions 20] [--only squad,llm,tables] [--json OUT]
    .venv/bin/python bench/answers.py --only spans [--span-articles 12] [--span-questions 600] --json OUT

--only spans: the extractive answer's EM / F1 against all human answers on SQuAD dev articles, before and after the
lead-in continuation and the index-time sentence vectors, with the int8 twin's sentence vectors (after-int8-sentences,
paired against after too) and with the int8 encoder throughout (squad_spans).

SmolLM2-135M runs through transformers on the CPU at tens of seconds per answer on 2 shared cores, so it answers a
seeded subset (--llm-questions) of the same questions; the extractive generator's figures on that subset are printed
beside it so the two are comparable. The LLM response cache makes a re-run cheap.

Data: ../shared/datasets/squad-dev/dev-v1.1.json.gz (every section but tables); without it those sections print a
message and are skipped.
"""

from __future__ import annotations

import json
import random
import sys
import time

from bench.lib import cli
from bench.lib.datasets import REPO, SQUAD, absent, squad_as_beir
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import write
from rag.evaluation.beir import load_beir, open_beir_index
from rag.evaluation.qaset import import_squad
from rag.markdown import markdown_table
from rag.qa import AnswerSettings
from rag.qa.bakeoff import BAKEOFF_MODES, run_bakeoff
from rag.store import data_dir

COLUMNS = [
    "mode",
    "generator",
    "exact_match",
    "f1",
    "rouge_l",
    "answer_accuracy",
    "source_accuracy",
    "attributed_source_accuracy",
    "coverage",
    "retrieved_evidence",
    "latency_p50_ms",
    "latency_p95_ms",
    "n_questions",
]


def squad_setup(model: str, n_questions: int):
    folder = squad_as_beir(data_dir() / "bench" / "squad-beir")
    started = time.perf_counter()
    index, _ = open_beir_index(load_beir(folder, "test"), "hybrid-rrf", model, data_dir() / "beir")
    _, items = import_squad(SQUAD)
    random.Random(7).shuffle(items)
    print(
        f"  {len(index.chunks)} paragraphs indexed (bm25 + {model}) in {time.perf_counter() - started:.1f}s; "
        f"{n_questions} of {len(items)} questions (seeded sample)"
    )
    return index, items[:n_questions]


def squad_figures(
    index, items, base: AnswerSettings, llm=None, label: str = "", modes: tuple[str, ...] = BAKEOFF_MODES
) -> list[dict]:
    started = time.perf_counter()
    result = run_bakeoff(
        items, {"squad": index}, base, modes=modes, llm=llm, progress=lambda m: print(f"    {label}{m}", flush=True)
    )
    print(f"  {label}done in {time.perf_counter() - started:.0f}s")
    print(markdown_table(result.summary, COLUMNS))
    return result.summary.to_dict("records")


def calibration(index, items, base: AnswerSettings) -> list[dict]:
    """The extractive generator's min_support threshold: coverage against accuracy (hybrid-rrf)."""
    rows = []
    for threshold in (0.0, 0.3, 0.5, 0.7):
        summary = run_bakeoff(
            items, {"squad": index}, base.model_copy(update={"min_support": threshold}), modes=("hybrid-rrf",)
        ).summary
        rows.append(
            {
                "min_support": threshold,
                **summary.iloc[0][["answer_accuracy", "f1", "source_accuracy", "coverage"]].to_dict(),
            }
        )
    import pandas as pd

    print(markdown_table(pd.DataFrame(rows), ["min_support", "answer_accuracy", "f1", "source_accuracy", "coverage"]))
    return rows


# Hand-verified on the sample corpus (federal-register-2020-17221.pdf pages 5-6, nics-background-checks-2015-11 p1).
TABLE_QUESTIONS = [
    ("What is the labor rate per hour?", "$85"),
    ("What is the parts cost per product?", "$3,790"),
    ("What is the total cost per product?", "$10,505"),
    ("What was the total number of NICS firearm background checks in November 2015?", "2,236,457"),
    ("How many permit checks were there in total in November 2015?", "804,006"),
]


def table_qa(model: str, llm_settings) -> list[dict]:
    from rag.pipeline import index_folder
    from rag.qa import Answerer

    root = data_dir() / "bench" / "sample-answers"
    index_folder(REPO / "sample_corpus", root, strategies=["paragraph"], models=[model])
    rows = []
    for generator in ("extractive", "llm"):
        if generator == "llm" and llm_settings is None:
            continue
        settings = AnswerSettings(
            strategy="paragraph", model=model, generator=generator, top_k=3, llm=llm_settings, max_context_chars=3000
        )
        answerer = Answerer(settings, root=root)
        for question, expected in TABLE_QUESTIONS:
            r = answerer.ask(question)
            tables = sum(1 for c in r.chunks if c["table_html"])
            cited_table = any(c["cited"] and c["table_html"] for c in r.chunks)
            rows.append(
                {
                    "generator": generator,
                    "question": question,
                    "expected": expected,
                    "correct": expected in r.answer,
                    "answer": r.answer[:120],
                    "table_chunks_in_prompt": tables,
                    "cited_a_table": cited_table,
                    "seconds": round(r.latency_ms / 1000, 1),
                }
            )
            print(
                f"  {generator:10s} {'OK ' if expected in r.answer else 'no '} {question} → {r.answer[:100]!r} "
                f"(tables in context: {tables}, {r.latency_ms / 1000:.1f}s)",
                flush=True,
            )
    return rows


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def squad_human_answers() -> dict[str, list[str]]:
    """Every human answer of each SQuAD dev question, by question id (QAItem keeps only the first)."""
    import gzip

    with gzip.open(SQUAD, "rt", encoding="utf-8") as fh:
        data = json.load(fh)["data"]
    return {
        str(qa["id"]): [a["text"] for a in qa["answers"]]
        for article in data
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }


class _Unshared:
    """An embedder behind another object: the Answerer then neither finds the data dir's sentence store for it nor
    reuses retrieval's question vector, which is how answers were made before either existed (the 'before' run)."""

    def __init__(self, embedder):
        self.inner, self.name, self.dim, self.version = embedder, embedder.name, embedder.dim, embedder.version

    def encode_queries(self, texts):
        return self.inner.encode_queries(texts)

    def encode_passages(self, texts):
        return self.inner.encode_passages(texts)

    encode = encode_passages


def _quantiles(values: list[float]) -> dict[str, float]:
    import numpy as np

    return {"p50_ms": round(float(np.percentile(values, 50)), 2), "p95_ms": round(float(np.percentile(values, 95)), 2)}


def squad_spans(model: str, int8_model: str | None, n_articles: int, n_questions: int, budget: int) -> dict:
    """The extractive answer's EM / F1 against all human answers on SQuAD dev articles indexed through the shared
    index step (chunk, BM25, collection and sentence vectors), before (no lead-in continuation; the sentence store and
    retrieval's question vector unused, as answers were made before them; the question encoded by the model) and
    after (both; the question encoded as AnswerSettings' default query_encoder says), and after with the int8
    encoder (collection, sentence vectors and question all int8); each after-run's per-question F1 beside before's
    in a paired test. Each run has its own opened index, so every
    question is encoded for retrieval in every run; stage times are per answer."""
    import pandas as pd

    from rag.chunking import get_chunker
    from rag.embedding import load_embedder
    from rag.evaluation.generation import exact_match, token_f1
    from rag.evaluation.loaders import squad_articles
    from rag.index.qdrant import QdrantSettings, get_client
    from rag.ingest import document_to_row
    from rag.pipeline import bm25_step, chunk_step, embed_step
    from rag.qa import Answerer
    from rag.qa.encoding import CachedEmbedder
    from rag.retrieval.service import open_index
    from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE, TableStore

    docs, items = squad_articles(SQUAD, max_articles=n_articles)
    random.Random(7).shuffle(items)
    items = items[:n_questions]
    human = squad_human_answers()
    root = data_dir() / "bench" / f"squad-spans-{n_articles}"
    tables, qdrant = TableStore(root / "tables"), QdrantSettings(path=str(root / "qdrant"))
    tables.write(pd.DataFrame([document_to_row(d, "bench") for d in docs]), DOCUMENTS_TABLE)
    chunked = chunk_step(tables, get_chunker("paragraph"))
    bm25_step(tables, root, "paragraph")
    out: dict = {
        "articles": len(docs),
        "chunks": len(chunked.chunks),
        "questions": len(items),
        "max_answer_chars": budget,
        "indexing": {},
        "runs": {},
    }
    models = [model] + ([int8_model] if int8_model else [])
    for name in models:
        started = time.perf_counter()
        run = embed_step(tables, get_client(qdrant), "paragraph", name, load_embedder(name))
        out["indexing"][name] = {**run.summary, "wall_seconds": round(time.perf_counter() - started, 1)}
        print(f"  indexed {len(chunked.chunks)} chunks with {name}: {out['indexing'][name]}", flush=True)
    # The model's chunks and retrieval, its int8 twin's sentence vectors (AnswerSettings.sentence_encoder "int8").
    started = time.perf_counter()
    run = embed_step(tables, get_client(qdrant), "paragraph", model, load_embedder(model), sentence_encoder="int8")
    wall = round(time.perf_counter() - started, 1)
    out["indexing"][f"{model}+int8-sentences"] = {**run.summary, "wall_seconds": wall}
    out["sentence_encode"] = _sentence_encode_seconds(model, tables.read(CHUNKS_TABLE, "paragraph")["text"].tolist())
    print(f"  sentence encode: {out['sentence_encode']}", flush=True)
    # (label, model, lead-ins and stored sentences, who encodes the question, who encodes the sentences)
    default_query = AnswerSettings().query_encoder
    runs = [
        ("before", model, False, "model", "model"),
        ("after", model, True, default_query, "model"),
        ("after-int8-sentences", model, True, default_query, "int8"),
    ] + ([("after-int8", int8_model, True, "model", "model")] if int8_model else [])
    per_question: dict[str, pd.Series] = {}
    for label, name, after, query_encoder, sentences_by in runs:
        settings = AnswerSettings(
            strategy="paragraph",
            model=name,
            reranker="none",
            continue_lead_ins=after,
            max_answer_chars=budget,
            query_encoder=query_encoder,
            sentence_encoder=sentences_by,
        )
        index = open_index("paragraph", name, root=root, qdrant=qdrant, query_encoder=query_encoder)
        embedder = None if after else CachedEmbedder(_Unshared(index.embedder))
        answerer = Answerer(settings, root=root, index=index, embedder=embedder)
        rows, stages = [], {}
        started = time.perf_counter()
        for item in items:
            result = answerer.ask(item.question)
            refs = human.get(item.qid) or [item.answer]
            answer = "" if result.not_in_context else result.answer
            rows.append(
                {
                    "em": exact_match(answer, refs),
                    "f1": token_f1(answer, refs),
                    "answered": not result.not_in_context,
                    "continued": "\n\n" in answer,
                    "chars": len(answer),
                }
            )
            for stage, ms in result.timings_ms.items():
                stages.setdefault(stage, []).append(ms)
        frame = pd.DataFrame(rows)
        per_question[label] = frame["f1"].set_axis([item.qid for item in items])
        answered = frame[frame["answered"]]
        out["runs"][label] = {
            "model": name,
            "query_encoder": query_encoder,
            "sentence_encoder": sentences_by,
            "continue_lead_ins": after,
            "sentence_store": after,
            "exact_match": round(frame["em"].mean(), 4),
            "f1": round(frame["f1"].mean(), 4),
            "f1_answered": round(answered["f1"].mean(), 4) if len(answered) else None,
            "coverage": round(frame["answered"].mean(), 4),
            "continued_answers": int(frame["continued"].sum()),
            "mean_answer_chars": round(answered["chars"].mean(), 1) if len(answered) else None,
            "stages": {stage: _quantiles(ms) for stage, ms in stages.items()},
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(f"  {label:10s} {json.dumps(out['runs'][label])}", flush=True)
    from rag.evaluation.metrics import paired_comparison

    def paired(label: str, baseline: str) -> dict:
        compared = paired_comparison(per_question[label], per_question[baseline])
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in compared.items()}

    out["paired_f1_vs_before"] = {label: paired(label, "before") for label in per_question if label != "before"}
    # The int8 sentence vectors' own effect: everything else as in "after".
    out["paired_f1_vs_after"] = {"after-int8-sentences": paired("after-int8-sentences", "after")}
    return out


def _sentence_encode_seconds(model: str, texts: list[str]) -> dict:
    """A bare encode of the chunks' distinct sentences, longest first, by the model and by its int8 twin, one after
    the other in this run: what the sentence-vector stage costs with each, apart from the store."""
    from rag.embedding import load_embedder
    from rag.embedding.onnx_int8 import int8_query_encoder
    from rag.qa.generators import sentence_units

    units = sorted(dict.fromkeys(u for t in texts for u in sentence_units(t or "")), key=len, reverse=True)
    embedder = load_embedder(model)
    twin, why_not = int8_query_encoder(model, embedder)
    out: dict = {"sentences": len(units), "int8_twin": twin.name if twin is not None else why_not}
    for label, encoder in (("model", embedder), ("int8", twin)):
        if encoder is None:
            continue
        started = time.perf_counter()
        for i in range(0, len(units), 256):
            encoder.encode_passages(units[i : i + 256])
        out[f"{label}_seconds"] = round(time.perf_counter() - started, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--llm-questions", type=int, default=20)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--llm-model", default="smollm2")
    parser.add_argument("--llm-modes", default=",".join(BAKEOFF_MODES), help="modes for the LLM, in the order run")
    parser.add_argument("--only", default="squad,calibration,llm,tables")
    cli.add_output(parser, flags=("--json",))
    parser.add_argument("--span-articles", type=int, default=12, help="spans: SQuAD dev articles indexed")
    parser.add_argument("--span-questions", type=int, default=600, help="spans: questions asked (seeded sample)")
    parser.add_argument("--span-int8-model", default="minilm-int8", help="spans: the int8 encoder compared ('' skips)")
    parser.add_argument("--max-answer-chars", type=int, default=AnswerSettings().max_answer_chars)
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if only == {"spans"}:  # its own result file, with provenance
        if absent(SQUAD, "SQuAD v1.1 dev"):
            return 0
        record = {"bench": "bench/answers.py --only spans", **run_record(args, torch_threads=_torch_threads())}
        record["spans"] = squad_spans(
            args.model, args.span_int8_model or None, args.span_articles, args.span_questions, args.max_answer_chars
        )
        if args.json:
            write(stamp_end(record), args.json, indent=2, default=str)
        return 0
    from rag.llm import LLMSettings, load_llm

    results: dict = {"questions": args.questions, "llm_questions": args.llm_questions}
    llm_settings = LLMSettings(backend="local-gguf", model=args.llm_model, max_new_tokens=48)
    # Small passages for a 135M model: two SQuAD paragraphs fit its useful context and keep CPU time bounded.
    extractive = AnswerSettings(strategy="squad", model=args.model, generator="extractive", top_k=5)
    llm_base = AnswerSettings(
        strategy="squad", model=args.model, generator="llm", top_k=2, max_context_chars=2500, llm=llm_settings
    )
    if only & {"squad", "calibration", "llm"} and not absent(SQUAD, "SQuAD v1.1 dev"):
        print("1. SQuAD dev: paragraphs as the corpus")
        index, items = squad_setup(args.model, args.questions)
        if "squad" in only:
            print(f"\n  extractive generator, {len(items)} questions")
            results["squad_extractive"] = squad_figures(index, items, extractive, label="extractive · ")
        if "calibration" in only:
            print("\n  extractive min_support calibration (hybrid-rrf, first 100 questions)")
            results["calibration"] = calibration(index, items[:100], extractive)
        if "llm" in only:
            subset = items[: args.llm_questions]
            print(f"\n  extractive on the {len(subset)}-question subset (for comparison)")
            results["squad_extractive_subset"] = squad_figures(index, subset, extractive, label="extractive · ")
            print(f"\n  SmolLM2 ({args.llm_model}, local-gguf), {len(subset)} questions, top-2 passages")
            results["squad_llm"] = squad_figures(
                index,
                subset,
                llm_base,
                llm=load_llm(llm_settings),
                label="smollm2 · ",
                modes=tuple(args.llm_modes.split(",")),
            )
    if "tables" in only:
        print("\n2. Table QA on the sample corpus (hand-verified answers)")
        results["tables"] = table_qa(args.model, llm_settings if "llm" in only else None)
    if args.json:
        write(results, args.json, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
