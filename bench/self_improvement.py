"""What users get from the loop, on human questions it never trained or gated on.

For each corpus, from the documents alone and through the product's own steps:
1. index: chunk_step, bm25_step and embed_step (the base MiniLM collection; `<strategy>__production` on it);
2. synthetic QA: `generate_qa` with the default question mix (no LLM), written as the synthetic_qa table;
3. before: today's former default serving (base minilm, hybrid-rrf, no reranker) and the new defaults before any
   training (production = base, hybrid-cc) answer every judged human question through `Answerer.rank`;
4. retrain_job in Dagster (ephemeral instance, the product's default promotion policy `auto`): trains, gates,
   promotes what the gate found significantly better and starts a canary for what it found only no worse; then
   each trained candidate, served as after its promotion, answers the judged questions (what it would give people:
   the truth its gate and canary decide on, measured before they act, so a rollback can be told from a lost gain);
5. users (--users-share of the human questions, never among those judged below) ask through the API with the
   defaults `rag serve` uses, one fresh session per question, and react with bench/canary_loop.py's click model
   (bench.lib.canary.Users: clicks and ratings on the passages the questions' qrels mark relevant); canary_sensor
   ticks after every batch and its promote or rollback job runs in-process, then a queued candidate's canary the same
   way (no manual step anywhere);
6. after: the default serving settings (production embedder and reranker, hybrid-cc) answer the judged questions.

Human questions: SQuAD dev questions over its articles (span relevance), SciFact test claims over its abstracts (their
qrels judge only here: the judged questions score every configuration, the users' questions only drive the canary).
Paired tests (rag.evaluation.metrics.paired_comparison) of after vs the former default, on the judged questions.

    .venv/bin/python bench/self_improvement.py --corpus squad               # all 48 SQuAD dev articles
    .venv/bin/python bench/self_improvement.py --corpus scifact             # all 5,183 abstracts, 300 claims
    .venv/bin/python bench/self_improvement.py --quick                      # 6 articles, a minute or few

Writes bench/results/self-improvement-<corpus>[-quick].json (arguments, commit, date, machine).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.canary import STRATEGY, add_click_model, load_corpus, split_users, users_decide
from bench.lib.datasets import RESULTS, SHARED
from bench.lib.provenance import rendered_or_skipped, run_record, stamp_end
from bench.lib.results import log, write

METRICS = ["recall@5", "ndcg@10", "mrr@10"]


def rankings(root: Path, qdrant, items, settings) -> dict[str, dict[str, float]]:
    """Every human question through the answer pipeline's ranking (retrieve, rerank, filter), as a ranx run."""
    from rag.qa import Answerer

    answerer = Answerer(settings, root=root, qdrant=qdrant)
    run = {}
    for item in items:
        hits = answerer.rank(item.question)
        run[item.qid] = {h.chunk["chunk_id"]: float(len(hits) - r) for r, h in enumerate(hits)}
    return run, answerer.served()


def scores(qrels, run):
    from rag.evaluation.metrics import evaluate_run

    mean, table = evaluate_run(qrels, run, METRICS)
    return {m: round(v, 4) for m, v in mean.items()}, table.set_index("qid")


def one_corpus(name: str, args, record: dict, save) -> None:
    import pandas as pd
    from dagster import DagsterInstance

    from orchestration.definitions import defs
    from rag.chunking import get_chunker
    from rag.embedding import load_embedder
    from rag.evaluation.metrics import paired_comparison
    from rag.evaluation.qaset import Relevance, qrels_for_chunks, to_frame
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.ingest import document_to_row
    from rag.pipeline import bm25_step, chunk_step, embed_step
    from rag.qa import AnswerSettings
    from rag.registry import ModelRegistry
    from rag.store import DOCUMENTS_TABLE, TableStore
    from rag.synthetic import SynthSettings, generate_qa
    from rag.lifecycle.rollout import running_canary
    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore

    out: dict = {"steps": {}}
    record["corpora"][name] = out
    started = time.perf_counter()
    docs, items = load_corpus(name, args)
    root = Path(tempfile.mkdtemp(prefix=f"self-improvement-{name}-"))
    os.environ["RAG_DATA_DIR"] = str(root)  # the retrain job's registry and the serving defaults read the data dir
    tables = TableStore(root / "tables")
    tables.write(pd.DataFrame([document_to_row(d, "bench") for d in docs]), DOCUMENTS_TABLE)
    chunks = chunk_step(tables, get_chunker(STRATEGY)).chunks
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    bm25_step(tables, root, STRATEGY)
    t = time.perf_counter()
    embed_step(tables, get_client(qdrant), STRATEGY, "minilm", load_embedder("minilm"))
    out["steps"]["index_seconds"] = round(time.perf_counter() - t, 1)
    all_qrels = qrels_for_chunks(items, chunks, Relevance())
    users_items, items = split_users(items, args.users_share, args.seed)
    qrels = {i.qid: all_qrels.get(i.qid, {}) for i in items}  # questions no chunk holds stay in as misses
    out |= {
        "documents": len(docs),
        "chunks": len(chunks),
        "human_questions": len(items),
        "human_questions_without_a_chunk": sum(not r for r in qrels.values()),
        "users_questions": len(users_items),
    }
    t = time.perf_counter()
    qa = generate_qa(
        docs,
        None,
        SynthSettings(
            passages_per_document=args.passages_per_document,
            questions_per_passage=args.questions_per_passage,
            seed=args.seed,
        ),
    )
    tables.write(to_frame(qa.items), "synthetic_qa")
    out["synthetic"] = {**qa.summary, "seconds": round(time.perf_counter() - t, 1)}
    log(f"{name}: {len(docs)} documents, {len(chunks)} chunks, {len(items)} human questions, synthetic {qa.summary}")

    configurations = {
        "former default (minilm, hybrid-rrf, no reranker)": AnswerSettings(
            model="minilm", mode="hybrid-rrf", reranker=None, top_k=10
        ),
        "default before training (production = base, hybrid-cc)": AnswerSettings(top_k=10),
    }
    tables_by_config, served = {}, {}
    for label, settings in configurations.items():
        run, served[label] = rankings(root, qdrant, items, settings)
        out.setdefault("served", {})[label], tables_by_config[label] = scores(qrels, run)
        log(f"{name} {label}: {out['served'][label]}")
    close_client(qdrant)  # the retrain job opens the folder through its resource

    t = time.perf_counter()
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", [STRATEGY])
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "qdrant": QdrantResource(path=qdrant.path),
        "rollout": Rollout(promotion="auto", traffic_share=args.canary_share),
        "feedback_loop": FeedbackLoop(data_dir=str(root)),
    }
    result = defs.resolve_job_def("retrain_job").execute_in_process(
        instance=instance,
        resources=resources,
        raise_on_error=False,
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
    )
    close_client(qdrant)
    registry = ModelRegistry(root / "models")
    out["retrain"] = {
        "success": result.success,
        "seconds": round(time.perf_counter() - t, 1),
        "gates": {
            e.check_name: {
                "passed": e.passed,
                **{k: getattr(v, "value", v) for k, v in e.metadata.items() if not k.startswith("comparison")},
            }
            for e in result.get_asset_check_evaluations()
        },
        "released": {
            e.asset_key.to_user_string(): {
                k: getattr(v, "value", v) for k, v in e.materialization.metadata.items() if k in ("action", "summary")
            }
            for e in result.get_asset_materialization_events()
            if e.asset_key.to_user_string() in ("production_embedder", "production_reranker")
        },
        "production": production_names(registry),
    }
    log(f"{name} retrain_job: success {result.success}, released {out['retrain']['released']}")
    before = "default before training (production = base, hybrid-cc)"
    out["candidates_served"] = candidates_served(root, qdrant, tables, registry, items, qrels, tables_by_config[before])
    close_client(qdrant)
    save()

    if users_items and running_canary(registry) is not None:
        users_decide(root, users_items, all_qrels, instance, resources, args, save_into=out, strategy=STRATEGY)
        out["production_after_canaries"] = production_names(registry)
        close_client(qdrant)
        save()

    label = (
        "default after retrain_job and the canaries users decided (production embedder and reranker, hybrid-cc)"
        if out.get("canaries")
        else "default after retrain_job (production embedder and reranker, hybrid-cc)"
    )
    run, served[label] = rankings(root, qdrant, items, AnswerSettings(top_k=10))
    out["served"][label], tables_by_config[label] = scores(qrels, run)
    out["served_versions"] = served
    log(f"{name} {label}: {out['served'][label]}")
    former = "former default (minilm, hybrid-rrf, no reranker)"
    out["paired_vs_former_default"] = {
        other: {m: paired_comparison(tables_by_config[other][m], tables_by_config[former][m]) for m in METRICS}
        for other in tables_by_config
        if other != former
    }
    out["seconds"] = round(time.perf_counter() - started, 1)
    close_client(qdrant)
    save()


def candidates_served(root: Path, qdrant, tables, registry, items, qrels, before_table) -> dict:
    """What each trained candidate would serve on the judged questions (served as after a promotion: hybrid-cc, the
    other kind's production), paired against the default before training. Measured before the gate's release and the
    canary act on it, so a rollback at the canary's horizon can be told from a gain thrown away."""
    from rag.evaluation.metrics import paired_comparison
    from rag.index.qdrant import get_client
    from rag.lifecycle.promotion import build_collections
    from rag.qa import AnswerSettings

    production = production_names(registry)
    trained = {
        kind: mv
        for kind in ("embedder", "reranker")
        if (mv := registry.resolve(kind, "candidate")) is not None and mv.name != production[kind]
    }
    configurations = {}
    if "embedder" in trained:  # its collection: idempotent, a canary's start built it already
        build_collections(trained["embedder"], tables=tables, client=get_client(qdrant), strategies=[STRATEGY], log=log)
        configurations[f"embedder {trained['embedder'].name} served"] = AnswerSettings(
            top_k=10, model=trained["embedder"].name
        )
    if "reranker" in trained:
        configurations[f"reranker {trained['reranker'].name} served"] = AnswerSettings(
            top_k=10, reranker=trained["reranker"].name
        )
    if len(trained) == 2:
        configurations["both served"] = AnswerSettings(
            top_k=10, model=trained["embedder"].name, reranker=trained["reranker"].name
        )
    served = {}
    for label, settings in configurations.items():
        run, versions = rankings(root, qdrant, items, settings)
        means, table = scores(qrels, run)
        served[label] = {
            "versions": versions,
            "scores": means,
            "paired_vs_before_training": {m: paired_comparison(table[m], before_table[m]) for m in METRICS},
        }
        log(f"  {label}: {means}")
    return served


def production_names(registry) -> dict:
    return {
        kind: (mv.name if (mv := registry.resolve(kind, "production")) else None) for kind in ("embedder", "reranker")
    }


def markdown(record: dict) -> str:
    """The README table, rendered from a result file."""
    lines = [
        "| corpus | served | recall@5 | nDCG@10 | MRR@10 | Δ recall@5 vs former default [95% CI], p |",
        "|---|---|---|---|---|---|",
    ]
    for name, corpus in record["corpora"].items():
        former = "former default (minilm, hybrid-rrf, no reranker)"
        for label, figures in corpus.get("served", {}).items():
            paired = corpus.get("paired_vs_former_default", {}).get(label, {}).get("recall@5")
            delta = (
                f"{paired['delta']:+.4f} [{paired['ci_low']:+.4f}, {paired['ci_high']:+.4f}], p {paired['p_value']:.2g}"
                if paired
                else ("—" if label == former else "(run not finished)")
            )
            served = corpus.get("served_versions", {}).get(label) or {}
            who = f" — {served.get('embedder')}, {served.get('reranker')}" if served else ""
            lines.append(
                f"| {name} | {label}{who} | {figures['recall@5']:.4f} | {figures['ndcg@10']:.4f} | "
                f"{figures['mrr@10']:.4f} | {delta} |"
            )
    return "\n".join(lines)


def main() -> int:
    p = cli.parser(__doc__, summary_only=True)
    p.add_argument("--corpus", choices=["squad", "scifact"], default="squad")
    p.add_argument("--articles", type=int, default=None, help="SQuAD dev articles (default: all 48)")
    p.add_argument(
        "--scifact-docs", type=int, default=None, help="abstracts beside the claims' relevant ones (default: all 5,183)"
    )
    p.add_argument("--questions", type=int, default=2000, help="human questions sampled (SciFact has 300)")
    p.add_argument("--passages-per-document", type=int, default=20)
    p.add_argument("--questions-per-passage", type=int, default=2)
    p.add_argument(
        "--users-share",
        type=float,
        default=0.5,
        help="share of the human questions that simulated users ask to decide a canary (never scored; 0: no users)",
    )
    p.add_argument("--canary-share", type=float, default=0.5, help="share of sessions a canary serves")
    p.add_argument("--canary-batch", type=int, default=50, help="questions asked between canary_sensor ticks")
    p.add_argument("--max-canary-asked", type=int, default=20000, help="questions asked per canary at most")
    add_click_model(p)
    cli.add_seed(p, 11)
    cli.add_quick(p, "6 SQuAD articles / 300 abstracts, 300 questions")
    cli.add_output(
        p, flags=("--out",), help="result JSON (default bench/results/self-improvement-<corpus>[-quick].json)"
    )
    cli.add_markdown(p)
    args = p.parse_args()
    if rendered_or_skipped(args, markdown, SHARED, "SQuAD dev and SciFact"):
        return 0
    if args.quick:
        args.articles, args.scifact_docs, args.questions = 6, 300, 300
    out = args.out or RESULTS / f"self-improvement-{args.corpus}{'-quick' if args.quick else ''}.json"
    record = {**run_record(args), "corpora": {}}

    def save() -> None:
        write(stamp_end(record), out, indent=2, default=str)

    one_corpus(args.corpus, args, record, save)
    print(json.dumps(record["corpora"][args.corpus]["served"], indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
