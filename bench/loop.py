"""Does the loop help people? Simulated people ask a corpus's users-split questions through `rag serve`, the product's
own sensors turn their clicks, ratings and corrections into retrains, gates, canaries and promotions, and after every
round the held-out test split is scored on exactly what the server serves, paired against the untrained default.

1. The documents are written as files and indexed by the product (`rag.pipeline.index_folder`, what `rag index`
   runs: parse, chunk, BM25, MiniLM vectors); the synthetic QA set the training assets warm-start from is generated
   as the `synthetic_qa` asset does (no LLM).
2. `rag serve`'s app (`rag.serving.server.build_app`, its default settings: production embedder and reranker,
   hybrid-cc, paragraph chunks; 10 passages shown) answers every question, in-process over HTTP semantics.
3. Rounds: people ask `--round-size` users-split questions, each its own person (client header) and session, with the
   click model of bench.lib.loop.ClickModel (position bias rank^-eta; clicks and +1 on passages holding the answer,
   -1 and noise clicks on others, answer votes, corrected answers). canary_sensor is evaluated every `--tick-every`
   questions while a canary runs; after the round feedback_volume_sensor, drift_sensor and canary_sensor are. Every
   job they request runs in the same Dagster instance: retrain_job, start_canary_job, promote_canary_job,
   rollback_canary_job. No training or promotion function is called by hand.
4. After each round the test split is ranked by the server's production answerer and scored (recall@5, nDCG@10,
   MRR@10, recall@20), paired (rag.evaluation.metrics.paired_comparison) against round 0, the untrained default.
5. With `--expert-labels N`, after the round's sensors annotation_after_retrain_sensor is evaluated too (after a
   retrain it runs annotation_queue_job, which rebuilds the expert queue), and a simulated expert
   (bench.lib.loop.Expert) grades up to N items of the queue through GET /annotation/next and POST
   /annotation/labels: 2 where the passage holds the answer as people judge it, else 0; items whose question no
   person asked (generated ones) are skipped. Expert labels count toward feedback_volume_sensor and go into the
   retrains and the gate's held-out questions.
6. With `--harm-drill`, before the first question an operator registers a deliberately harmful reranker (trained on
   the warm start's labels shuffled across questions), gates it, and starts its canary over the verdict
   (start_canary_job with a force reason); `harm_drill` in the result says what ended the canary and when.

    .venv/bin/python bench/loop.py --corpus tatqa                 # TAT-QA: users ask dev questions, test scores
    .venv/bin/python bench/loop.py --corpus scifact               # 809 train claims ask, 300 test claims score
    .venv/bin/python bench/loop.py --corpus conditionalqa         # split by question, pages shared
    .venv/bin/python bench/loop.py --corpus squad                 # split by article
    .venv/bin/python bench/loop.py --corpus tatqa --behaviour random     # people who click at random
    .venv/bin/python bench/loop.py --corpus tatqa --behaviour inverted --canary-behaviour consistent  # poisoned
    .venv/bin/python bench/loop.py --corpus tatqa --quick         # a slice, minutes
    .venv/bin/python bench/loop.py --corpus tatqa --expert-labels 20     # and an expert grades 20 items a round
    .venv/bin/python bench/loop.py --corpus tatqa --futility-win-share off  # canaries never stopped for futility
    .venv/bin/python bench/loop.py --corpus tatqa --promotion-test one-sided  # canaries promoted on a one-sided test
    .venv/bin/python bench/loop.py --corpus tatqa --learners reranker --rounds 1 --tick-every 10 \
        --feedback-threshold 1000000 --harm-drill                  # is a harmful canary rolled back, and when?

Writes bench/results/loop-<corpus>[-<behaviour>][-<learners>][-experts<N>][-futility<share>|-no-futility]
[-<test>-promotion][-harm-drill][-quick].json (arguments, commit, date, machine).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS
from bench.lib.loop import (
    BEHAVIOURS,
    HEADLINE,
    ClickModel,
    Expert,
    Judge,
    Operations,
    People,
    configuration_ceiling,
    embedders_on_test,
    rerankers_on_test,
    served_app,
    served_versions,
)
from bench.lib.loop_data import CORPORA, SOURCES, load
from bench.lib.provenance import rendered_or_skipped, run_record, stamp_end
from bench.lib.results import log, write


def one_corpus(args, record: dict, save) -> None:
    from dagster import DagsterInstance
    from fastapi.testclient import TestClient

    from rag.feedback import FeedbackStore
    from rag.index.qdrant import QdrantSettings, close_client
    from rag.pipeline import index_folder
    from rag.registry import ModelRegistry
    from rag.rerank.features import FEATURES
    from rag.store import TableStore
    from rag.lifecycle.rollout import running_canary
    from rag.training.configuration import ReadBudget
    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore

    out: dict = {"rounds": []}
    record["corpus"] = out
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f"loop-{args.corpus}-"))
    root = work / "data"
    os.environ["RAG_DATA_DIR"] = str(root)  # the jobs' registry, the serving defaults and the sensors read it
    corpus = load(args.corpus, work, args)
    out |= corpus.summary()
    out["headline"] = HEADLINE.get(args.corpus, "recall@5")  # the figure the renderers lead with
    out["reranker_features"] = list(FEATURES)  # what this version's reranker learner reads (the ablation tells them)
    log(f"{args.corpus}: {out}")

    t = time.perf_counter()
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    report = index_folder(corpus.docs_dir, root, strategies=args.strategies, models=["minilm"], qdrant=qdrant)
    close_client(qdrant)
    tables = TableStore(root / "tables")
    out["index"] = {
        "seconds": round(time.perf_counter() - t, 1),
        "documents": report.parse.get("documents"),
        "quarantined": report.parse.get("quarantined_total"),
        "chunks": {s: c.get("chunks") for s, c in report.chunks.items()},
    }
    out["synthetic"] = warm_start(tables, args) if args.passages_per_document else None
    log(f"  indexed in {out['index']['seconds']} s; synthetic {out['synthetic']}")
    save()

    judge = Judge(tables, corpus.test)
    users_judge = Judge(tables, corpus.users)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", args.strategies)
    instance.add_dynamic_partitions("embedding_model", ["minilm"])
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "qdrant": QdrantResource(path=qdrant.path),
        "rollout": Rollout(
            promotion="auto", traffic_share=args.canary_share, **futility_config(args), **promotion_config(args)
        ),
        "feedback_loop": FeedbackLoop(
            data_dir=str(root),
            volume_threshold=args.feedback_threshold,
            retrain_run_config=retrain_config(args),
            learners=args.learners,
        ),
    }
    store = FeedbackStore(root=root)
    app = served_app(root, store)
    registry = ModelRegistry(root / "models")

    def refresh() -> None:
        app.state.serving.refresh(force=True)

    ops = Operations(instance, resources, refresh, say=log)
    clicks = ClickModel(
        eta=args.eta,
        p_relevant=args.p_relevant,
        p_negative=args.p_negative,
        p_click_noise=args.p_click_noise,
        p_answer_rating=args.p_answer_rating,
        p_correction=args.p_correction,
        behaviour=args.behaviour,
        canary_behaviour=getattr(args, "canary_behaviour", None),
    )
    with TestClient(app) as http:
        served = app.state.serving.current()
        out["round_0"] = {**judge.score(served), "production": served_versions(registry)}
        log(f"  round 0 (untrained default): {out['round_0']['scores']}")
        save()
        if args.ceiling:
            t = time.perf_counter()
            budget = ReadBudget.of(served.settings)
            grid = configuration_ceiling(tables, root, judge, corpus.test, args.strategies, budget)
            out["ceiling"] = {
                "what": "every configuration of the learner's grid scored on the test split's own labels (an oracle)",
                "read_budget": {"top_k": budget.top_k, "max_context_chars": budget.max_chars},
                "configurations": grid,
                "seconds": round(time.perf_counter() - t, 1),
            }
            log(f"  ceiling (oracle on the test labels): {grid[:3]}")
            save()

        def relevant(question) -> set[str]:
            # What people recognise as answering, in whichever chunk set a passage comes from: a configuration's
            # canary interleaves the candidate's chunk set with production's, and its passages answer just as well.
            return {c for strategy in args.strategies for c in users_judge.qrels(strategy).get(question.qid, {})}

        drill = start_harm_drill(tables, registry, ops, args.seed) if getattr(args, "harm_drill", False) else None
        if drill is not None:
            out["harm_drill"] = drill
            log(f"  harm drill: {drill}")
            save()
        people = People(http, clicks, relevant, seed=args.seed)
        expert_labels = getattr(args, "expert_labels", 0) or 0
        expert = Expert(http, corpus.users, relevant) if expert_labels > 0 else None
        queue = list(corpus.users)
        for number in range(1, args.rounds + 1):
            if not queue:
                break
            t = time.perf_counter()
            before, log_start = dict(people.stats), len(ops.log)
            batch, queue = queue[: args.round_size], queue[args.round_size :]
            for i, question in enumerate(batch, start=1):
                people.ask(question, person=f"r{number}-{question.qid}")
                if i % args.tick_every == 0 and running_canary(registry) is not None:
                    ops.tick("canary_sensor")
                    settle_harm_drill(drill, registry, ops, people.stats)
            for sensor in ("canary_sensor", "feedback_volume_sensor", "drift_sensor", "canary_sensor"):
                ops.tick(sensor)
                if sensor == "canary_sensor":
                    settle_harm_drill(drill, registry, ops, people.stats)
            experts = None
            if expert is not None:  # the queue is rebuilt after each retrain; the expert grades what it holds now
                ops.tick("annotation_after_retrain_sensor")
                experts = expert.label(expert_labels)
                log(f"  expert: {experts}")
            close_client(qdrant)
            served = app.state.serving.current()
            entry = {
                "round": number,
                "asked_total": people.stats["asked"],
                "people": {k: people.stats[k] - before.get(k, 0) for k in people.stats},
                "operations": ops.log[log_start:],
                "production": served_versions(registry),
                "canary_running": bool(running_canary(registry)),
                **({"experts": experts} if experts is not None else {}),
                **judge.score(served),
                "seconds": round(time.perf_counter() - t, 1),
            }
            out["rounds"].append(entry)
            headline = out["headline"]
            paired = entry["paired_vs_untrained_default"][headline]
            log(
                f"  round {number}: asked {entry['asked_total']}, production {entry['production']}, {headline} "
                f"{entry['scores'][headline]:.4f} ({paired['delta']:+.4f}, p {paired['p_value']:.2g})"
            )
            save()
        if "reranker" in args.learners:
            out["rerankers_on_test"] = rerankers_on_test(app, judge, registry)
            for row in out["rerankers_on_test"]:
                log(f"  {row['name']} on the test split (oracle view): {row['scores']}")
        if "embedder" in args.learners:
            close_client(qdrant)  # the candidates' collections are opened as replicas, as a canary opens them
            out["embedders_on_test"] = embedders_on_test(app, judge, registry)
            for row in out["embedders_on_test"]:
                log(f"  {row['name']} on the test split (oracle view): {row['scores'] or row.get('not_scored')}")
    out["seconds"] = round(time.perf_counter() - started, 1)
    out["work_dir"] = str(work)
    save()


def start_harm_drill(tables, registry, ops, seed: int) -> dict:
    """An operator's drill before the first question: a deliberately harmful reranker (trained on the warm start's
    labels shuffled across questions, bench.lib.harm) is gated against production, then canaried over the gate's
    verdict (start_canary_job with a force reason, as an operator rehearsing a rollback would), so what the people
    the canary serves make canary_sensor do is measured: settle_harm_drill records it."""
    from dagster import RunRequest

    from bench.lib.harm import shuffled_reranker
    from rag.training import GateSettings
    from rag.training.pipeline import gate_candidate

    mv = shuffled_reranker(tables, registry, seed, lambda _: None)
    verdict = gate_candidate("reranker", tables, registry, mv, GateSettings()).metadata
    reason = "harm drill: a reranker trained on labels shuffled across questions, canaried to rehearse its rollback"
    config = {"kind": "reranker", "candidate": mv.version, "force_reason": reason}
    started = ops.run(
        "start_canary_job", RunRequest(run_config={"ops": {"start_canary_op": {"config": config}}}), "operator"
    )
    gate = ("outcome", "questions", "delta_ndcg@10", "p_value_ndcg@10", "delta_mrr@10", "p_value_mrr@10", "reasons")
    return {
        "candidate": mv.name,
        "version": mv.version,
        "gate": {k: verdict.get(k) for k in gate},
        "canary_started": started["success"],
        "asked_before": 0,
        "canary_served_before": 0,
    }


def settle_harm_drill(drill: dict | None, registry, ops, stats: dict) -> None:
    """Once the drill's canary no longer runs: where its rollout ended (rolled_back or production) and why, the job
    that ended it, after how many people's questions and how many of them the canary served."""
    from rag.lifecycle.rollout import read_state, running_canary

    if drill is None or "outcome" in drill or not drill.get("canary_started"):
        return
    running = running_canary(registry)
    if running is not None and running[1].candidate_version == drill["version"]:
        return
    state = read_state(registry, "reranker")
    ended = next((op for op in reversed(ops.log) if op.get("job")), {})
    drill |= {
        "outcome": state.stage if state is not None and state.candidate_version == drill["version"] else "unknown",
        "reason": state.reason if state is not None else None,
        "ended_by": ended.get("job"),
        "after_questions": stats["asked"] - drill["asked_before"],
        "canary_queries": stats["canary_served"] - drill["canary_served_before"],
    }


def warm_start(tables, args) -> dict:
    """The synthetic QA set the training assets start from, as the synthetic_qa asset writes it (no LLM)."""
    from rag.evaluation.qaset import to_frame
    from rag.ingest import document_from_row
    from rag.store import DOCUMENTS_TABLE
    from rag.synthetic import SynthSettings, generate_qa

    t = time.perf_counter()
    docs = [document_from_row(row) for _, row in tables.read(DOCUMENTS_TABLE).iterrows()]
    qa = generate_qa(
        docs,
        None,
        SynthSettings(passages_per_document=args.passages_per_document, questions_per_passage=1, seed=args.seed),
    )
    tables.write(to_frame(qa.items), "synthetic_qa")
    return {**qa.summary, "seconds": round(time.perf_counter() - t, 1)}


def retrain_config(args) -> dict:
    """What feedback_volume_sensor hands both training assets beside the exported feedback (FeedbackLoop's
    retrain_run_config, as an operator sets it)."""
    config = {"seed": args.seed}
    if args.max_steps:
        config["max_steps"] = args.max_steps
    if args.max_pairs:
        config["max_pairs"] = args.max_pairs
    return config


def _served(entry: dict) -> str:
    served = entry.get("served") or {}
    return f"{served.get('strategy', '?')} · {served.get('mode', '?')}"


def markdown(record: dict) -> str:
    """Rounds of one loop run: what served, its headline figure and the paired test against round 0."""
    corpus = record.get("corpus", {})
    metric = corpus.get("headline") or HEADLINE.get(corpus.get("corpus", "?"), "recall@5")
    lines = [
        f"| round | people's questions so far | serving (chunks · mode, embedder, reranker) | what the sensors ran | "
        f"{metric} | "
        f"Δ vs untrained default [95% CI], p |",
        "|---|---|---|---|---|---|",
    ]
    first = corpus.get("round_0", {})
    if first:
        lines.append(
            f"| 0 | 0 | {_served(first)}, {first['production']['embedder'] or 'minilm (base)'}, "
            f"{first['production']['reranker'] or 'none'} | — | {first['scores'][metric]:.4f} | — |"
        )
    for entry in corpus.get("rounds", []):
        runs = [op for op in entry["operations"] if "job" in op]
        ran = "; ".join(f"{op['job']} ({'ok' if op['success'] else 'failed'})" for op in runs) or "—"
        paired = entry["paired_vs_untrained_default"][metric]
        lines.append(
            f"| {entry['round']} | {entry['asked_total']:,} | {_served(entry)}, "
            f"{entry['production']['embedder'] or 'minilm (base)'}, "
            f"{entry['production']['reranker'] or 'none'} | {ran} | {entry['scores'][metric]:.4f} | "
            f"{paired['delta']:+.4f} [{paired['ci_low']:+.4f}, {paired['ci_high']:+.4f}], p {paired['p_value']:.2g} |"
        )
    return "\n".join(lines)


def futility_config(args) -> dict:
    """The rollout's futility_win_share from --futility-win-share: the product's default when not given."""
    share = getattr(args, "futility_win_share", None)
    return {} if share is None else {"futility_win_share": None if share == "off" else share}


def promotion_config(args) -> dict:
    """The rollout's promotion_test from --promotion-test: the product's default when not given."""
    test = getattr(args, "promotion_test", None)
    return {} if test is None else {"promotion_test": test}


def futility_share(text: str) -> float | str:
    return "off" if text == "off" else float(text)


def result_name(args) -> str:
    """loop-<corpus>[-<behaviour>[-canary-<behaviour>]][-<learners>][-experts<N>][-futility<share>|-no-futility]
    [-<test>-promotion][-harm-drill][-quick].json: the defaults leave their part out."""
    share = getattr(args, "futility_win_share", None)
    judged = f"-canary-{args.canary_behaviour}" if args.canary_behaviour else ""
    suffix = (
        ("" if args.behaviour == "consistent" else f"-{args.behaviour}{judged}")
        + ("" if len(args.learners) == 3 else "-" + "+".join(args.learners))
        + (f"-experts{args.expert_labels}" if getattr(args, "expert_labels", 0) > 0 else "")
        + ("" if share is None else "-no-futility" if share == "off" else f"-futility{share:g}")
        + ("" if getattr(args, "promotion_test", None) is None else f"-{args.promotion_test}-promotion")
        + ("-harm-drill" if getattr(args, "harm_drill", False) else "")
        + ("-quick" if args.quick else "")
    )
    return f"loop-{args.corpus}{suffix}.json"


def main() -> int:
    p = cli.parser(__doc__, summary_only=True)
    p.add_argument("--corpus", choices=CORPORA, default="tatqa")
    p.add_argument("--data", type=Path, help="corpus beir: a BEIR folder with qrels/users.tsv and qrels/test.tsv")
    p.add_argument(
        "--learners",
        nargs="+",
        choices=["embedder", "reranker", "configuration"],
        default=["embedder", "reranker", "configuration"],
        help="what the feedback retrains train (FeedbackLoop.learners): an ablation names fewer",
    )
    p.add_argument(
        "--strategies",
        nargs="+",
        default=["paragraph", "fixed-512", "recursive-1000-200", "section-low", "whole-document"],
        help="chunk sets indexed (the server starts on its default, paragraph; a configuration may move it)",
    )
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="also score every configuration of the learner's grid on the test labels (an oracle ceiling)",
    )
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--round-size", type=int, default=250, help="people's questions per round")
    p.add_argument("--tick-every", type=int, default=50, help="questions between canary_sensor ticks in a canary")
    p.add_argument("--feedback-threshold", type=int, default=100, help="FeedbackLoop.volume_threshold")
    p.add_argument("--canary-share", type=float, default=0.5, help="share of sessions a canary serves")
    p.add_argument(
        "--futility-win-share",
        type=futility_share,
        help="the rollout's futility_win_share: a canary whose evidence favours no edge over this win share is "
        "rolled back early; 'off' never (default: the product's, rag.rollout.CanarySettings)",
    )
    p.add_argument(
        "--promotion-test",
        choices=["two-sided", "one-sided"],
        help="the rollout's promotion_test: the mixture a canary's promotion must cross (default: the product's)",
    )
    p.add_argument("--users-questions", type=int, default=None, help="users-split questions (default: all)")
    p.add_argument("--test-questions", type=int, default=None, help="test-split questions scored (default: all)")
    p.add_argument("--documents", type=int, default=None, help="documents (judged ones kept; default: all)")
    p.add_argument("--articles", type=int, default=None, help="SQuAD dev articles (default: all 48)")
    p.add_argument("--users-share", type=float, default=0.5, help="conditionalqa/squad: share asked by people")
    p.add_argument("--passages-per-document", type=int, default=4, help="synthetic warm start (0: none)")
    p.add_argument("--max-steps", type=int, default=None, help="training steps per retrain (default: the assets')")
    p.add_argument("--max-pairs", type=int, default=None, help="training pairs per retrain (default: the assets')")
    p.add_argument("--behaviour", choices=list(BEHAVIOURS), default="consistent")
    p.add_argument(
        "--canary-behaviour",
        choices=list(BEHAVIOURS),
        help="how the answers a canary interleaves are judged (default: as --behaviour); consistent with a corrupted "
        "--behaviour: a harmful candidate judged by the people it serves",
    )
    p.add_argument("--eta", type=float, default=1.0, help="position bias: rank r is examined with probability r^-eta")
    p.add_argument("--p-relevant", type=float, default=0.9)
    p.add_argument("--p-negative", type=float, default=0.2)
    p.add_argument("--p-click-noise", type=float, default=0.05)
    p.add_argument("--p-answer-rating", type=float, default=0.5)
    p.add_argument("--p-correction", type=float, default=0.2)
    p.add_argument(
        "--expert-labels",
        type=int,
        default=0,
        help="after each round's sensors, annotation_after_retrain_sensor rebuilds the expert queue after a retrain "
        "and a simulated expert grades up to this many of its items through /annotation/* (0: no expert)",
    )
    p.add_argument(
        "--harm-drill",
        action="store_true",
        help="before the first question an operator canaries a deliberately harmful reranker over its gate's verdict "
        "(start_canary_job with a force reason); the result's harm_drill says what ended its canary and when",
    )
    cli.add_seed(p, 11)
    cli.add_quick(p, "a slice: 80 documents, 150 people's questions in 2 rounds, 150 test questions, short training")
    cli.add_output(p, flags=("--out",), help="result JSON (default bench/results/loop-<corpus>[...].json)")
    cli.add_markdown(p)
    args = p.parse_args()
    source = args.data if args.corpus == "beir" else SOURCES[args.corpus]
    if rendered_or_skipped(args, markdown, Path(source or "."), f"the {args.corpus} data"):
        return 0
    if args.quick:
        args.documents, args.articles = args.documents or 80, args.articles or 6
        args.users_questions, args.test_questions = args.users_questions or 150, args.test_questions or 150
        args.rounds, args.round_size, args.feedback_threshold = 2, 75, min(args.feedback_threshold, 50)
        args.max_steps, args.max_pairs = args.max_steps or 8, args.max_pairs or 400
    out = args.out or RESULTS / result_name(args)
    record = run_record(args)

    def save() -> None:
        write(stamp_end(record), out, indent=2, default=str)

    one_corpus(args, record, save)
    print(markdown(record))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
