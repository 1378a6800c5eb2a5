"""Does the promotion gate say what people would see? Documents-only self-improvement on corpora that have human
questions, each candidate's gate verdict beside its true effect on those questions.

For each corpus the pipeline's own path runs from the documents alone: a paragraph chunk set, `generate_qa` with the
default question mix (no LLM), then candidates trained through `train_candidate` and gated by `gate_candidate`
against the base model (production stays the implicit v0, nothing is promoted). Candidates: embedders and learned
rerankers over several seeds, the older reranker setting that trains on copied questions (`copied_questions: cut`),
a reranker that never learns from how much of the question a passage holds (`question_overlap_features: false`),
rerankers boosted from the first stage's order (`first_stage_prior`, `--first-stage-prior`),
deliberately bad ones (an embedder with noise on its weights, a reranker trained on shuffled labels) and deliberately
good ones: the base embedder gated against a production damaged with a little noise (`--good-noise`), candidates
known to help people, to see whether the gate lets a real gain through (they never trained on the generated
questions, so the rule for trained candidates, rag.training.gate.hold_generated_gain, does not hold them back).

The true effect is measured on the corpus's human questions, which nothing trains or gates on: SQuAD dev questions
over its articles (span relevance), SciFact test claims over their abstracts and distractors (qrels used only here).
Embedders are compared on dense retrieval, rerankers on the first stage they re-order (the training first stage,
rag.training.first_stage.FIRST_STAGE_MODE, top 50 of the base embedder), each with a paired test
(rag.evaluation.metrics.paired_comparison) on recall@5 and nDCG@10.

    .venv/bin/python bench/gate_calibration.py                          # both corpora, default sizes
    .venv/bin/python bench/gate_calibration.py --quick                  # a few articles / abstracts, one seed each
    .venv/bin/python bench/gate_calibration.py --kinds embedder --seeds # the untrained embedders only

Writes bench/results/gate-calibration[-quick].json (arguments, commit, date, machine) after every candidate.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS, SCIFACT, SHARED, SQUAD
from bench.lib.harm import shuffled_reranker
from bench.lib.provenance import rendered_or_skipped, run_record, stamp_end
from bench.lib.results import log, write

STRATEGY = "paragraph"
TRUE_METRICS = ["recall@5", "ndcg@10"]


# --- corpora ---------------------------------------------------------------------------------------------------------
def squad_corpus(articles: int, questions: int, seed: int):
    from rag.evaluation.loaders import squad_articles

    docs, items = squad_articles(SQUAD, max_articles=articles)
    return docs, random.Random(seed).sample(items, min(questions, len(items)))


def scifact_corpus(distractors: int, questions: int, seed: int):
    """The test claims' relevant abstracts plus `distractors` others; the claims (qrels) only judge the effect."""
    from rag.evaluation.loaders import beir_documents

    docs, items = beir_documents(SCIFACT, "test")
    items = random.Random(seed).sample(items, min(questions, len(items)))
    wanted = {e.doc_id for i in items for e in i.evidence}
    others = [d for d in docs if d.doc_id not in wanted]
    keep = wanted | {d.doc_id for d in random.Random(seed).sample(others, min(distractors, len(others)))}
    return [d for d in docs if d.doc_id in keep], items


def chunk_set(docs):
    import pandas as pd

    from rag.chunk_sets import update_chunk_set
    from rag.chunking import get_chunker
    from rag.ingest import document_to_row

    return update_chunk_set(
        None, pd.DataFrame([document_to_row(d, "bench") for d in docs]), get_chunker(STRATEGY)
    ).chunks


# --- truth on human questions ---------------------------------------------------------------------------------------
def human_set(items, chunks):
    from rag.evaluation.qaset import Relevance, qrels_for_chunks
    from rag.training.data import IRSet

    qrels = qrels_for_chunks(items, chunks, Relevance())
    qrels = {i.qid: qrels.get(i.qid, {}) for i in items}  # questions no chunk holds stay in as misses
    return IRSet({i.qid: i.question for i in items}, dict(zip(chunks["chunk_id"], chunks["text"])), qrels)


def per_question(ir, run):
    from rag.evaluation.metrics import evaluate_run

    return evaluate_run(ir.qrels, run, TRUE_METRICS)[1].set_index("qid")


def true_effect(candidate_table, base_table) -> dict:
    from rag.evaluation.metrics import paired_comparison

    return {m: paired_comparison(candidate_table[m], base_table[m]) for m in TRUE_METRICS}


# --- one corpus ------------------------------------------------------------------------------------------------------
def calibrate(name: str, docs, human, args, record: dict, save) -> None:
    import pandas as pd

    from rag.embedding import _minilm_dir, load_embedder
    from rag.evaluation.qaset import to_frame
    from rag.registry import ModelRegistry
    from rag.rerank import load_reranker
    from rag.rollout.drill import noisy_copy
    from rag.store import CHUNKS_TABLE, TableStore
    from rag.synthetic import SynthSettings, generate_qa
    from rag.training import EmbedderTrainingConfig, GateSettings, RerankerTrainingConfig
    from rag.training.first_stage import FIRST_STAGE_MODE
    from rag.training.gate import dense_run, reranked_run
    from rag.training.pipeline import gate_candidate, hybrid_candidates, load_inputs, train_candidate

    started = time.perf_counter()
    chunks = chunk_set(docs)
    qa = generate_qa(
        docs,
        None,
        SynthSettings(
            passages_per_document=args.passages_per_document,
            questions_per_passage=args.questions_per_passage,
            seed=args.seed,
        ),
    )
    types = pd.Series([i.qtype for i in qa.items]).value_counts().to_dict()
    human_ir = human_set(human, chunks)
    corpus = {
        "setup_seconds": None,
        "documents": len(docs),
        "chunks": len(chunks),
        "human_questions": len(human_ir),
        "human_questions_without_a_chunk": sum(not r for r in human_ir.qrels.values()),
        "synthetic_questions": len(qa.items),
        "synthetic_types": types,
        "candidates": [],
    }
    record["corpora"][name] = corpus
    log(
        f"{name}: {len(docs)} documents, {len(chunks)} chunks, {len(qa.items)} synthetic questions {types}, "
        f"{len(human_ir)} human questions"
    )
    work = Path(tempfile.mkdtemp(prefix=f"gate-calibration-{name}-"))
    tables = TableStore(work / "tables")
    tables.write(chunks, CHUNKS_TABLE, STRATEGY)
    tables.write(to_frame(qa.items), "synthetic_qa")
    registry = ModelRegistry(work / "models")
    settings = GateSettings(resamples=args.resamples)
    base = load_embedder(_minilm_dir())
    base_dense = per_question(human_ir, dense_run(base, human_ir))
    first_stage = hybrid_candidates(chunks, human_ir, base, settings.rerank_depth)
    base_hybrid = per_question(human_ir, reranked_run(first_stage, human_ir, None))
    corpus["base"] = {
        "dense": base_dense[TRUE_METRICS].mean().round(4).to_dict(),
        "first_stage": FIRST_STAGE_MODE,
        "hybrid": base_hybrid[TRUE_METRICS].mean().round(4).to_dict(),
    }
    qa_version = load_inputs(tables, EmbedderTrainingConfig(strategy=STRATEGY)).qa_version
    corpus["setup_seconds"] = round(time.perf_counter() - started, 1)
    quiet = lambda _msg: None  # noqa: E731 - the trainers' step logs would drown the bench's own lines

    def judge(label: str, kind: str, mv, setting: str, trained_seconds: float | None = None, *, against=None) -> None:
        """`against` (embedders only: rerankers are measured against the plain first stage): the registry whose
        production the candidate is gated and measured against (default: the base model, production's implicit v0)."""
        began = time.perf_counter()
        if against is not None and kind != "embedder":
            raise ValueError("only embedders are gated against another production here")
        models = against or registry
        production = models.resolve(kind, "production")
        try:
            result = gate_candidate(kind, tables, models, mv, settings)
            gate = {
                "outcome": result.outcome,
                "passed": bool(result.passed),
                "questions": result.questions,
                "copied_set_aside": result.copied_questions,
                "better_on_generated": result.better_on_generated,
                **{k: v for k, v in result.metadata.items() if k.startswith(("delta_", "ci_", "p_value", "type_"))},
                **result.power,
            }
        except ValueError as exc:  # too few gate questions: no verdict, which is itself a finding
            gate = {"outcome": "no verdict", "passed": False, "error": str(exc)}
        if kind == "embedder":
            model = per_question(human_ir, dense_run(load_embedder(str(mv.path)), human_ir))
            served = (
                base_dense
                if production is None
                else per_question(human_ir, dense_run(load_embedder(str(production.path)), human_ir))
            )
            truth = true_effect(model, served)
        else:
            model = per_question(
                human_ir, reranked_run(first_stage, human_ir, load_reranker(mv.name, registry=registry))
            )
            truth = true_effect(model, base_hybrid)
        row = {
            "candidate": label,
            "kind": kind,
            "setting": setting,
            "version": mv.name,
            "against": production.name if production else "base",
            "gate": gate,
            "true_effect": truth,
            # what a reader needs to size a run: training, then gate plus truth
            "seconds": {"train": trained_seconds, "gate_and_truth": round(time.perf_counter() - began, 1)},
        }
        corpus["candidates"].append(row)
        log(
            f"{name} {label}: gate {gate['outcome']} ({gate.get('delta_ndcg@10', float('nan')):+.4f} nDCG@10 on "
            f"{gate.get('questions', 0)} questions); true recall@5 {truth['recall@5']['delta']:+.4f} "
            f"(p {truth['recall@5']['p_value']:.3g}), nDCG@10 {truth['ndcg@10']['delta']:+.4f}; "
            f"seconds {row['seconds']}"
        )
        save()

    if "embedder" in args.kinds:
        noisy = noisy_copy(_minilm_dir(), work / "noisy", args.bad_noise, seed=args.seed)
        mv = registry.register(
            "embedder", noisy, {"base_model": "minilm", "strategy": STRATEGY, "qa_set_version": qa_version}
        )
        judge(f"embedder with noise {args.bad_noise} on its weights (deliberately bad)", "embedder", mv, "noisy_copy")
    for scale in args.good_noise if "embedder" in args.kinds else []:
        restoring = ModelRegistry(work / f"models-restoring-{scale}")
        damaged = noisy_copy(_minilm_dir(), work / f"damaged-{scale}", scale, seed=args.seed)
        meta = {"base_model": "minilm", "strategy": STRATEGY, "qa_set_version": qa_version}
        restoring.set_alias("embedder", "production", restoring.register("embedder", damaged, meta).version)
        judge(
            f"base embedder against a production with noise {scale} on its weights (deliberately good)",
            "embedder",
            restoring.register("embedder", Path(_minilm_dir()), meta),
            "base model vs noisy_copy production",
            against=restoring,
        )

    def trained(label: str, kind: str, config, setting: str | None = None) -> None:
        """Train a candidate through the product's path, then judge it; `setting` names it (default: its config)."""
        began = time.perf_counter()
        mv, _, _ = train_candidate(kind, tables, registry, config, log=quiet)
        described = setting or config.model_dump_json(exclude={"extra_positives", "extra_negatives"})
        judge(label, kind, mv, described, round(time.perf_counter() - began, 1))

    for seed in args.seeds if "embedder" in args.kinds else []:
        config = EmbedderTrainingConfig(strategy=STRATEGY, seed=seed, max_pairs=args.max_pairs)
        trained(f"embedder seed {seed}", "embedder", config)
    if "reranker" not in args.kinds:
        corpus["seconds"] = round(time.perf_counter() - started, 1)
        save()
        return

    for seed in args.seeds:
        trained(f"reranker seed {seed}", "reranker", RerankerTrainingConfig(strategy=STRATEGY, seed=seed))
    trained(
        "reranker trained on copied questions too (the older setting)",
        "reranker",
        RerankerTrainingConfig(strategy=STRATEGY, seed=args.seeds[0], copied_questions="cut"),
        "copied_questions=cut",
    )
    for seed in args.seeds:
        trained(
            f"reranker without the question-overlap features, seed {seed}",
            "reranker",
            RerankerTrainingConfig(strategy=STRATEGY, seed=seed, question_overlap_features=False),
            "question_overlap_features=false",
        )
    for prior in args.first_stage_prior:
        for seed in args.seeds:
            trained(
                f"reranker boosted from the first stage's order (prior {prior:g}), seed {seed}",
                "reranker",
                RerankerTrainingConfig(strategy=STRATEGY, seed=seed, first_stage_prior=prior),
                f"first_stage_prior={prior:g}",
            )
    judge(
        "reranker trained on shuffled labels (deliberately bad)",
        "reranker",
        shuffled_reranker(tables, registry, args.seeds[0], quiet, STRATEGY),
        "positives shuffled across questions",
    )
    corpus["seconds"] = round(time.perf_counter() - started, 1)
    save()


# --- summary ---------------------------------------------------------------------------------------------------------
def significant_loss(row: dict, metric: str) -> bool:
    effect = row["true_effect"][metric]
    return effect["delta"] < 0 and effect["p_value"] < 0.05


def summarize(record: dict, gain: float) -> dict:
    """The calibration targets: no accepted candidate whose true effect is a significant loss (recall@5, the
    target's metric; nDCG@10 listed beside it, since a candidate can keep recall@5 and still rank worse); among
    candidates whose true recall@5 gain is at least `gain` (p < 0.05), those the gate rejected (judged worse, or no
    verdict: the candidate is dropped) and those it held for the canary (no worse but not promoted directly: only
    people's evidence can promote them)."""
    named = [(f"{name}: {r['candidate']}", r) for name, c in record["corpora"].items() for r in c["candidates"]]
    rows = [r for _, r in named]
    loss = [r["candidate"] for r in rows if r["gate"]["passed"] and significant_loss(r, "recall@5")]
    ndcg_loss = [label for label, r in named if r["gate"]["passed"] and significant_loss(r, "ndcg@10")]
    gains = [
        (label, r)
        for label, r in named
        if r["true_effect"]["recall@5"]["delta"] >= gain and r["true_effect"]["recall@5"]["p_value"] < 0.05
    ]
    held = [label for label, r in gains if not r["gate"]["passed"] and r["gate"].get("outcome") == "inconclusive"]
    return {
        "candidates": len(rows),
        "accepted": sum(r["gate"]["passed"] for r in rows),
        "accepted_with_a_true_loss": loss,
        "accepted_with_a_true_ndcg_loss": ndcg_loss,
        "true_gains": len(gains),
        "true_gains_rejected": [label for label, r in gains if not r["gate"]["passed"] and label not in held],
        "true_gains_held_for_the_canary": held,
        "true_gain_threshold": gain,
    }


def markdown(record: dict) -> str:
    """The README table, rendered from a result file."""
    lines = [
        "| corpus | candidate | gate (questions) | gate Δ nDCG@10 [95% CI] | true Δ recall@5 (p) | true Δ nDCG@10 (p) "
        "|",
        "|---|---|---|---|---|---|",
    ]
    for name, corpus in record["corpora"].items():
        for r in corpus["candidates"]:
            g, t = r["gate"], r["true_effect"]
            ci = f" [{g['ci_low_ndcg@10']:+.3f}, {g['ci_high_ndcg@10']:+.3f}]" if "ci_low_ndcg@10" in g else ""
            shown = f"{g['delta_ndcg@10']:+.3f}{ci}" if "delta_ndcg@10" in g else "—"
            lines.append(
                f"| {name} | {r['candidate']} | {g['outcome']} ({g.get('questions', 0)}) | {shown} | "
                f"{t['recall@5']['delta']:+.3f} ({t['recall@5']['p_value']:.2g}) | "
                f"{t['ndcg@10']['delta']:+.3f} ({t['ndcg@10']['p_value']:.2g}) |"
            )
    return "\n".join(lines)


def main() -> int:
    p = cli.parser(__doc__, summary_only=True)
    p.add_argument("--corpus", action="append", choices=["squad", "scifact"], help="repeatable; default both")
    p.add_argument("--articles", type=int, default=16, help="SQuAD dev articles used as documents")
    p.add_argument("--squad-questions", type=int, default=1500, help="human questions sampled over those articles")
    p.add_argument("--scifact-distractors", type=int, default=700, help="abstracts beside the claims' relevant ones")
    p.add_argument("--scifact-questions", type=int, default=300)
    p.add_argument("--passages-per-document", type=int, default=40)
    p.add_argument("--questions-per-passage", type=int, default=2)
    p.add_argument(
        "--kinds", nargs="+", choices=["embedder", "reranker"], default=["embedder", "reranker"], help="candidates"
    )
    p.add_argument(
        "--seeds", type=int, nargs="*", default=[1, 2, 3], help="training seeds; none: embedders' controls only"
    )
    p.add_argument("--max-pairs", type=int, default=2000, help="embedder training pairs")
    p.add_argument("--bad-noise", type=float, default=0.4, help="noise scale of the deliberately bad embedder")
    p.add_argument(
        "--good-noise",
        type=float,
        nargs="*",
        default=[0.15, 0.2],
        help="noise scales of the damaged productions the deliberately good embedder (the base model) is gated "
        "against, one candidate each (its true effect is what the damage costs on the human questions); none "
        "leaves them out",
    )
    p.add_argument(
        "--first-stage-prior",
        type=float,
        nargs="*",
        default=[1.0],
        help="rerankers boosted from the first stage's order with these priors (first_stage_prior), one per seed "
        "each; none leaves them out",
    )
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--gain", type=float, default=0.03, help="a true recall@5 gain at least this large should pass")
    cli.add_seed(p, 11)
    cli.add_quick(p, "4 SQuAD articles, 300 abstracts, one seed")
    cli.add_markdown(p)
    cli.add_output(p, flags=("--out",), help="result JSON (default bench/results/gate-calibration[-quick].json)")
    args = p.parse_args()
    if rendered_or_skipped(args, markdown, SHARED, "SQuAD dev and SciFact"):
        return 0
    if "reranker" in args.kinds and not args.seeds:
        p.error("rerankers are trained candidates: give --seeds at least one seed, or --kinds embedder")
    if args.quick:
        args.articles, args.squad_questions, args.scifact_distractors, args.scifact_questions = 4, 400, 200, 100
        args.seeds, args.max_pairs, args.passages_per_document = args.seeds[:1], 600, 20
    out = args.out or RESULTS / f"gate-calibration{'-quick' if args.quick else ''}.json"
    record = {**run_record(args), "corpora": {}}

    def save() -> None:
        record["summary"] = summarize(record, args.gain)
        write(stamp_end(record), out, indent=2, default=str)

    for name in args.corpus or ["squad", "scifact"]:
        if name == "squad":
            docs, human = squad_corpus(args.articles, args.squad_questions, args.seed)
        else:
            docs, human = scifact_corpus(args.scifact_distractors, args.scifact_questions, args.seed)
        calibrate(name, docs, human, args, record, save)
    save()
    print(markdown(record))
    print(json.dumps(record["summary"], indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
