"""How far can the loop's reranker learner go with perfect labels? The same learner the loop retrains (LambdaMART over
the first stage, the pipeline's defaults) trained on complete labels of the loop's own judge instead of people's
clicks, served as a reranker canary arm is and scored on the test split, paired against the untrained default: the
measured ceiling beside the loop's served figure (bench/loop.py).

Arms (bench.lib.learner_ceiling): `users-<n>`, the first n users-split questions people ask in the loop, every chunk
holding the answer labelled; `test-in-sample`, the test split's own questions and labels scored on themselves (an
oracle). The documents are indexed by the product (paragraph chunks, MiniLM), as bench/loop.py indexes them. Each
arm's labels also count as the people's likes behind the ranker's feedback priors, as the loop's retrain counts its
training side's likes (before 5c01361 they did not, and SciFact's ceiling read 0.745 where it reaches 0.78).

    .venv/bin/python bench/reranker_ceiling.py --corpus tatqa                     # users 250 500 1000 all, and test
    .venv/bin/python bench/reranker_ceiling.py --corpus tatqa --generated         # and with generated questions
    .venv/bin/python bench/reranker_ceiling.py --corpus tatqa --users 1000 --quick
    .venv/bin/python bench/reranker_ceiling.py --corpus tatqa --users 1000 --ablate document_features=false

`--clicks N ...` adds, for the first N users' questions, `clicks-N clicks`: the learner trained on what the loop's
simulated people clicked, rated and corrected when the untrained default answered them (as a retrain builds its data,
without generated questions), and `clicks-N liked-complete`: the same with each question people liked labelled
completely. Between them and `users-N` lies what clicks cost the learner: on the questions people liked, and on the
ones nobody liked.

`--ablate FIELD=VALUE ...` adds, beside each users arm, the same arm trained with that one learner setting
(rag.training.config.RerankerTrainingConfig) changed, one arm per setting: what a feature group or a rule adds with
perfect labels. `--without FIELD` is `--ablate FIELD=false`; `--without feedback_priors` adds each users arm with no
likes counted (what the ceiling measured before).

Writes bench/results/reranker-ceiling-<corpus>[-quick].json (arguments, commit, date, machine).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS
from bench.lib.learner_ceiling import clicked_data, generated_data, labelled_data, train_arm, with_generated
from bench.lib.loop import HEADLINE, ClickModel, Judge, People, scored, served_app, served_lists
from bench.lib.loop_data import CORPORA, SOURCES, load
from bench.lib.provenance import rendered_or_skipped, run_record, stamp_end
from bench.lib.results import log, write

STRATEGY = "paragraph"  # what the server serves before a configuration is promoted
PRIORS = "feedback_priors"  # `--without feedback_priors`: the arm's ranker counts no likes (not a learner setting)


def run(args, record: dict, save) -> None:
    from fastapi.testclient import TestClient

    from rag.embedding import load_embedder
    from rag.feedback import FeedbackStore
    from rag.index.qdrant import QdrantSettings, close_client
    from rag.pipeline import index_folder
    from rag.retrieval.service import open_index
    from rag.serving.server import RerankerArm
    from rag.store import CHUNKS_TABLE, TableStore
    from rag.training.config import RerankerTrainingConfig
    from rag.training.first_stage import vectors_by_text

    out: dict = {"arms": []}
    record["corpus"] = out
    work = Path(tempfile.mkdtemp(prefix=f"ceiling-{args.corpus}-"))
    root = work / "data"
    os.environ["RAG_DATA_DIR"] = str(root)
    corpus = load(args.corpus, work, args)
    out |= corpus.summary()
    out["headline"] = metric = HEADLINE.get(args.corpus, "recall@5")
    t = time.perf_counter()
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    index_folder(corpus.docs_dir, root, strategies=[STRATEGY], models=["minilm"], qdrant=qdrant)
    tables = TableStore(root / "tables")
    chunks = tables.read(CHUNKS_TABLE, STRATEGY)
    index = open_index(STRATEGY, "minilm", root=root, qdrant=qdrant, need_bm25=False)
    known = vectors_by_text(index)
    close_client(qdrant)
    out["index_seconds"] = round(time.perf_counter() - t, 1)
    log(f"{args.corpus}: {len(chunks)} chunks indexed in {out['index_seconds']} s")
    embedder = load_embedder("minilm")

    judge = Judge(tables, corpus.test)
    users_qrels = Judge(tables, corpus.users).qrels(STRATEGY)
    store = FeedbackStore(root=root)
    app = served_app(root, store)
    with TestClient(app) as http:
        default = app.state.serving.current()
        out["untrained_default"] = judge.score(default)
        log(f"  untrained default: {out['untrained_default']['scores']}")
        out["first_stage"] = first_stage_recall(default, judge, corpus.test, root)
        log(f"  first stage: {out['first_stage']}")
        save()
        arms = [(f"users-{n}", corpus.users[:n], users_qrels) for n in args.users if n < len(corpus.users)]
        arms.append((f"users-{len(corpus.users)}", corpus.users, users_qrels))
        arms.append(("test-in-sample", corpus.test, judge.qrels(STRATEGY)))
        if args.generated:
            generated, out["generated"] = generated_data(tables, chunks, args.passages_per_document, args.seed)
            log(f"  generated questions: {generated.summary}")
            arms += [
                (f"{name}+generated", questions, qrels) for name, questions, qrels in arms if name != "test-in-sample"
            ]
        arms = [(name, questions, qrels, {}) for name, questions, qrels in arms]
        ablations = [{field: False} for field in args.without] + [ablation(item) for item in args.ablate]
        arms += [
            (f"{name} {arm_suffix(options)}", questions, qrels, options)
            for options in ablations
            for name, questions, qrels, _ in list(arms)
            if name.startswith("users-") and not name.endswith("+generated")
        ]
        out["learner"] = RerankerTrainingConfig(seed=args.seed).model_dump(mode="json")

        def serve_arm(name: str, data, counts: dict, options: dict, liked: list, disliked: list = ()) -> None:
            """Train the arm, serve it as a reranker canary arm is, score it on the test split and record it."""
            log(f"  {name}: {counts}")
            learner = {k: v for k, v in options.items() if k != PRIORS}
            model, trained = train_arm(name, data, chunks, embedder, known, work, args.seed, learner, liked, disliked)
            scored = judge.score(RerankerArm(app.state.serving.current, str(model), root).current())
            paired = scored["paired_vs_untrained_default"]
            out["arms"].append({"arm": name, "learner_options": options, **counts, **trained, **scored})
            log(
                f"  {name}: {metric} {scored['scores'][metric]:.4f} "
                f"({paired[metric]['delta']:+.4f}, p {paired[metric]['p_value']:.2g})"
            )
            save()

        for name, questions, qrels, options in arms:
            data, counts = labelled_data(questions, qrels, chunks, args.seed)
            # The loop's learner counts people's likes as feedback priors (never generated questions): so does this
            liked = list(data.positives) if options.get(PRIORS, True) else []
            if name.endswith("+generated"):
                data = with_generated(data, generated)
                counts |= {"generated_pairs": len(generated.positives), "selection_questions": len(data.selection)}
            serve_arm(name, data, counts, options, liked)
        people = People(http, ClickModel(), lambda q: set(users_qrels.get(q.qid, {})), seed=args.seed)
        asked = 0
        for n in sorted(set(args.clicks)):
            questions = corpus.users[:n]
            arms_of = clicked_data(people, store, questions, users_qrels, chunks, work, asked)
            for suffix, (data, (liked, disliked), counts) in arms_of.items():
                serve_arm(f"clicks-{len(questions)} {suffix}", data, counts, {}, liked, disliked)
            asked = len(questions)
    out["work_dir"] = str(work)
    save()


def ablation(item: str) -> dict:
    """`FIELD=VALUE` as one RerankerTrainingConfig change, validated by the config itself."""
    from rag.training.config import RerankerTrainingConfig

    field, sep, value = item.partition("=")
    if not sep or field not in RerankerTrainingConfig.model_fields:
        raise SystemExit(f"--ablate {item!r}: give FIELD=VALUE with a RerankerTrainingConfig field")
    parsed = RerankerTrainingConfig.model_validate({field: value})
    return {field: getattr(parsed, field)}


def arm_suffix(options: dict) -> str:
    """How an ablation arm is named: `without FIELD` for a switch turned off, else `FIELD=VALUE`."""
    return " ".join(f"without {k}" if v is False else f"{k}={v}" for k, v in options.items())


def first_stage_recall(default, judge, questions, root: Path) -> dict:
    """Recall of the untrained default's first stage down to the depth a reranker re-orders (the served settings'
    rerank_depth): what no reranker can bring into the top 5 is what this misses."""
    from rag.qa import Answerer

    depth = default.settings.rerank_depth
    wide = Answerer(
        default.settings.model_copy(update={"k": depth, "top_k": depth, "reranker": None}),
        root=root,
        index=default.index,
        attribution_scorer=default.attribution_scorer,
        embedder=default.embedder,
    )
    run, _, _ = served_lists(wide, questions, depth=depth)
    means, _ = scored(judge.qrels(STRATEGY), run, questions, [f"recall@{k}" for k in (5, 10, 20, depth)])
    return {"depth": depth, **means}


def markdown(record: dict) -> str:
    corpus = record.get("corpus", {})
    metric = corpus.get("headline", "recall@5")
    base = (corpus.get("untrained_default") or {}).get("scores") or {}
    first = corpus.get("first_stage") or {}
    depth = first.get("depth", 50)
    lines = [
        f"First stage (the untrained default's hybrid ranking, what a reranker re-orders): recall@5 "
        f"{first.get('recall@5', 0):.4f}, recall@10 {first.get('recall@10', 0):.4f}, recall@20 "
        f"{first.get('recall@20', 0):.4f}, recall@{depth} {first.get(f'recall@{depth}', 0):.4f}.",
        "",
        f"| arm | questions labelled (training / selection) | {metric} | Δ {metric} [95% CI], p | answer read "
        "| Δ answer read, p |",
        "|---|---|---|---|---|---|",
        f"| untrained default | — | {base.get(metric, 0):.4f} | — | {base.get('answer_read', 0):.4f} | — |",
    ]
    for arm in corpus.get("arms", []):
        s, p = arm["scores"], arm["paired_vs_untrained_default"]
        r, a = p[metric], p["answer_read"]
        lines.append(
            f"| {arm['arm']} | {arm['training_questions']:,} / {arm['selection_questions']:,} | {s[metric]:.4f} | "
            f"{r['delta']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}], p {r['p_value']:.2g} | "
            f"{s['answer_read']:.4f} | {a['delta']:+.4f}, p {a['p_value']:.2g} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = cli.parser(__doc__, summary_only=True)
    p.add_argument("--corpus", choices=[c for c in CORPORA if c != "beir"], default="tatqa")
    p.add_argument(
        "--users", type=int, nargs="+", default=[250, 500, 1000], help="users-split question counts (all is added)"
    )
    p.add_argument("--users-questions", type=int, default=None, help="users-split questions (default: all)")
    p.add_argument("--test-questions", type=int, default=None, help="test-split questions scored (default: all)")
    p.add_argument("--documents", type=int, default=None, help="documents (judged ones kept; default: all)")
    p.add_argument("--articles", type=int, default=None, help="SQuAD dev articles (default: all 48)")
    p.add_argument("--users-share", type=float, default=0.5, help="conditionalqa/squad: share asked by people")
    p.add_argument(
        "--generated", action="store_true", help="also each users arm with the loop's generated questions mixed in"
    )
    p.add_argument("--passages-per-document", type=int, default=4, help="generated questions: as the loop's default")
    p.add_argument(
        "--without",
        nargs="+",
        default=[],
        choices=["document_features", "question_overlap_features", PRIORS],
        help="also each users arm with this learner setting switched off",
    )
    p.add_argument(
        "--ablate",
        nargs="+",
        default=[],
        metavar="FIELD=VALUE",
        help="also each users arm with this one learner setting changed (one arm per setting)",
    )
    p.add_argument(
        "--clicks",
        type=int,
        nargs="+",
        default=[],
        help="also arms trained on what the loop's people click, rate and correct after this many questions, and on "
        "the same liked questions labelled completely",
    )
    cli.add_seed(p, 11)
    cli.add_quick(p, "a slice: 80 documents, 150 users' and 150 test questions")
    cli.add_output(p, flags=("--out",), help="result JSON (default bench/results/reranker-ceiling-<corpus>.json)")
    cli.add_markdown(p)
    args = p.parse_args()
    if rendered_or_skipped(args, markdown, Path(SOURCES[args.corpus] or "."), f"the {args.corpus} data"):
        return 0
    if args.quick:
        args.documents, args.articles = args.documents or 80, args.articles or 6
        args.users_questions, args.test_questions = args.users_questions or 150, args.test_questions or 150
    name = f"reranker-ceiling-{args.corpus}{'-quick' if args.quick else ''}.json"
    out = args.out or RESULTS / name
    record = run_record(args)

    def save() -> None:
        write(stamp_end(record), out, indent=2, default=str)

    run(args, record, save)
    print(markdown(record))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
