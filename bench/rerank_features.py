"""How long the learned ranker's features take per question, for passages it has not seen yet (its passage-term
cache cold, as in a canary's first requests) and for passages it has (warm); and how long a served answerer takes
to learn every passage's terms in the background before its first questions (warm_up).

SciFact's test claims as questions (their qrels are not read), each against 50 abstracts drawn at random: abstracts
are the long passages where a canary's latency guardrail rolled the learned ranker back
(`bench/results/self-improvement-scifact.json`). Features only: the booster's prediction comes on top of both.

    .venv/bin/python bench/rerank_features.py [--questions 100] [--candidates 50] [--seed 0] [--json PATH]

Data: ../shared/datasets/scifact; without it the run prints a message and exits 0.
"""

from __future__ import annotations

import json
import random
import sys
import time
from types import SimpleNamespace

import numpy as np

from bench.lib import cli
from bench.lib.datasets import RESULTS, scifact_absent
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import write

OUT = RESULTS / "rerank-features-scifact.json"


def summary(ms: list[float]) -> dict:
    return {"median_ms": round(float(np.median(ms)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2)}


def measure(args) -> dict:
    from rag.rerank.features import CorpusStats, PassageTerms, feature_matrix

    docs = [json.loads(line) for line in (args.scifact / "corpus.jsonl").open()]
    texts = [f"{d.get('title', '')} {d['text']}".strip() for d in docs]
    claims = [json.loads(line)["text"] for line in (args.scifact / "queries.jsonl").open()]
    rng = random.Random(args.seed)
    claims = rng.sample(claims, min(args.questions, len(claims)))
    stats = CorpusStats.build(texts)  # tokenizes the corpus: the tokenizer and stemmer load outside the timings
    cold, warm = [], []
    for claim in claims:
        cache = PassageTerms()  # a fresh cache per question: every passage unseen on the first pass
        picked = rng.sample(range(len(texts)), args.candidates)
        hits = [
            SimpleNamespace(rank=r + 1, chunk={"text": texts[i]}, signals={"dense_score": 0.5, "bm25_score": 1.0})
            for r, i in enumerate(picked)
        ]
        for times in (cold, warm):  # the same passages twice: first unseen, then remembered
            started = time.perf_counter()
            feature_matrix(claim, hits, stats, passage_terms=cache)
            times.append((time.perf_counter() - started) * 1000)
    # What a served answerer does in the background before its first questions (Answerer.warm_reranker_in_background).
    started = time.perf_counter()
    learned = PassageTerms().warm(texts)
    warm_up_seconds = time.perf_counter() - started
    return {
        "passages": len(texts),
        "warm_up": {"passages": learned, "seconds": round(warm_up_seconds, 2)},
        "questions": len(claims),
        "candidates_per_question": args.candidates,
        "cold": summary(cold),
        "warm": summary(warm),
    }


def main() -> int:
    p = cli.parser(__doc__)
    cli.add_scifact(p)
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--candidates", type=int, default=50, help="passages per question (the rerank depth)")
    cli.add_seed(p)
    cli.add_output(p, OUT)
    args = p.parse_args()
    if scifact_absent(args.scifact):
        return 0
    record = run_record(args)
    record.update(measure(args))
    print(json.dumps({k: record[k] for k in ("cold", "warm", "warm_up")}))
    write(stamp_end(record), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
