"""Render every figure in the docs from bench/results/*.json, so no figure is ever typed.

    .venv/bin/python docs/render.py            # rewrite docs/benchmarks.md and the figure blocks (`make docs`)
    .venv/bin/python docs/render.py --check    # exit 1 when a committed page differs from a fresh render

docs/benchmarks.md is written whole: one section per result file with the question it answers, its figures and its
provenance (commit, date, arguments, machine). Any other page of docs/ (and README.md) may hold blocks

    <!-- figures:FILE -->              every table of bench/results/FILE.json
    <!-- figures:FILE:VIEW -->         one of them (the view names are listed under each section of benchmarks.md)
    <!-- figures:FILE? -->             the same, or "not measured yet" while bench/results/FILE.json is absent
    ...                                (replaced on every render)
    <!-- /figures -->

A block naming an absent result file fails the render unless it ends with `?` (a figure promised before it is
measured).

A result file of a kind this script does not know gets the generic rendering (its scalar figures in a flat
table), so a new benchmark shows up without a code change; a kind earns its own render function once its figures
deserve a real table. Output is deterministic (sorted files, fixed number formats): a re-render is byte-identical.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
BENCHMARKS = "benchmarks.md"
# Pages outside docs/ whose figure blocks are filled too.
EXTRA_PAGES = ("README.md",)
BLOCK = re.compile(r"(<!-- figures:(?P<name>[A-Za-z0-9._:@+-]+\??) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
PROVENANCE_KEYS = {
    "args",
    "argv",
    "commit",
    "date",
    "finished",
    "machine",
    "bench",
    "cpu_cores",
    "loop_commit",
    "data_dir",
    "loadavg_at_end",
}

Table = tuple[list[str], list[list[str]]]


# --- number formats -------------------------------------------------------------------------------------------------


def num(value, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 1_000 else str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def ms(value) -> str:
    return "—" if value is None else f"{value:.1f}"


def signed(value, digits: int = 4) -> str:
    return "—" if value is None else f"{value:+.{digits}f}"


def pvalue(value) -> str:
    return "—" if value is None else f"{value:.2g}"


def p50_p95(figures: dict | None) -> str:
    if not figures:
        return "—"
    return f"{ms(figures.get('p50_ms'))}/{ms(figures.get('p95_ms'))}"


def markdown(table: Table) -> str:
    head, rows = table
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def get(record, *path, default=None):
    for key in path:
        if not isinstance(record, dict) or key not in record:
            return default
        record = record[key]
    return record


# --- one render function per kind of result file ----------------------------------------------------------------------
# Each returns {view name: table}, in the order they should appear.


def edge_latency(record: dict) -> dict[str, Table]:
    views: dict[str, Table] = {}
    runs = record.get("runs", [])
    modes = ("bm25", "dense", "hybrid-rrf", "hybrid-cc", "encode")
    rows = []
    for run in runs:
        for encoder, figures in run.get("latency", {}).items():
            rows.append([run["engine"], num(run["points"]), encoder] + [p50_p95(figures.get(m)) for m in modes])
    if rows:
        views["latency"] = (["engine", "points", "query encoder / variant"] + [f"{m} p50/p95 ms" for m in modes], rows)
    rows = []
    for run in runs:
        build = run.get("build", {})
        recall = run.get("recall") or {}
        rows.append(
            [
                run["engine"],
                num(run["points"]),
                num(build.get("build_seconds"), 1),
                num(build.get("bm25_terms_seconds"), 1),
                num(build.get("upsert_seconds"), 1),
                num(build.get("optimize_seconds"), 1),
                num(run.get("reopen_seconds"), 2),
                num(run.get("disk_mb"), 1),
                num(get(run, "rss_mb", "process_peak"), 1),
            ]
            + [num(get(recall, e, "recall@10")) for e in ("minilm", "minilm-int8")]
        )
    if rows:
        views["build"] = (
            [
                "engine",
                "points",
                "build s",
                "BM25 terms s",
                "upsert s",
                "HNSW s",
                "reopen s",
                "disk MB",
                "peak RSS MB",
                "recall@10 vs exact at the engine's default hnsw_ef (minilm)",
                "(minilm-int8)",
            ],
            rows,
        )
    rows = []
    for run in runs:
        for encoder, recall in sorted((run.get("recall") or {}).items()):
            for ef, figures in sorted(recall.get("by_hnsw_ef", {}).items(), key=lambda kv: int(kv[0])):
                rows.append(
                    [
                        run["engine"],
                        num(run["points"]),
                        encoder,
                        ef,
                        num(figures.get("recall@10_of_limit100")),
                        p50_p95(figures.get("dense_only_limit100")),
                    ]
                )
    if rows:
        views["recall"] = (
            ["engine", "points", "query encoder", "hnsw_ef", "recall@10 vs exact", "dense-only p50/p95 ms"],
            rows,
        )
    rows = []
    for quality in record.get("quality", []):
        rows.append(
            [quality["engine"], quality["encoder"], quality.get("bm25_source", "—")]
            + [num(get(quality, m, "ndcg@10")) for m in modes[:4]]
        )
    if rows:
        views["quality"] = (["engine", "encoder", "BM25 source"] + [f"{m} nDCG@10" for m in modes[:4]], rows)
    for skipped in record.get("skipped", []):
        views.setdefault("skipped", (["engine", "points", "why not measured"], []))[1].append(
            [skipped.get("engine", "—"), num(skipped.get("points")), skipped.get("reason", "—")]
        )
    return views


def hnsw_recall(record: dict) -> dict[str, Table]:
    rows = []
    for run in record.get("runs", []):
        for ef, figures in sorted(run.get("by_hnsw_ef", {}).items(), key=lambda kv: int(kv[0])):
            rows.append(
                [
                    num(run["points"]),
                    num(run.get("points_per_document"), 1),
                    str(run["m"]),
                    str(run.get("level0_links", "—")),
                    ef,
                    num(figures["recall@10"]),
                    p50_p95(figures.get("dense_limit100")),
                    str(figures.get("misses_document_found_through_another_copy", "—")),
                    str(figures.get("misses_document_not_found", "—")),
                    num(get(run, "build", "optimize_s"), 1),
                ]
            )
    return {
        "recall": (
            [
                "points",
                "copies per document",
                "m",
                "level-0 links",
                "hnsw_ef",
                "recall@10 vs exact",
                "dense p50/p95 ms",
                "misses: another copy found",
                "misses: document not found",
                "HNSW build s",
            ],
            rows,
        )
    }


def training(record: dict) -> dict[str, Table]:
    rows = []
    for stage, figures in record.get("stages", {}).items():
        test = figures.get("test", {})
        rows.append(
            [
                stage,
                str(figures.get("model", "—")),
                str(figures.get("kind", "—")),
                num(figures.get("training_pairs")),
                str(test.get("compared_with", "—")),
                num(test.get("base_ndcg@10")),
                num(test.get("ndcg@10")),
                signed(test.get("delta_ndcg@10")),
                pvalue(test.get("p_value_ndcg@10")),
                num(figures.get("train_wall_seconds"), 1),
                num(figures.get("rerank_ms_per_query"), 1),
            ]
        )
    views = {
        "stages": (
            [
                "stage",
                "model",
                "kind",
                "training pairs",
                "compared with",
                "before nDCG@10",
                "after",
                "Δ",
                "p",
                "train s",
                "rerank ms/query",
            ],
            rows,
        )
    }
    base = [
        [mode] + [num(figures.get(m)) for m in ("ndcg@10", "mrr@10", "recall@10")]
        for mode, figures in record.get("base", {}).items()
    ]
    if base:
        views["base"] = (["untrained start", "nDCG@10", "MRR@10", "recall@10"], base)
    return views


def canary_loop(record: dict) -> dict[str, Table]:
    rows = []
    for phase, figures in record.get("phases", {}).items():
        rows.append(
            [
                phase,
                num(figures.get("candidate")),
                num(figures.get("decision")),
                num(figures.get("canary_queries")),
                num(figures.get("decisive_canary_queries")),
                f"{figures.get('wins', '—')} / {figures.get('losses', '—')} / {figures.get('ties', '—')}",
                num(figures.get("log_likelihood_ratio"), 2),
                num(figures.get("threshold"), 2),
            ]
        )
    views = {
        "canaries": (
            [
                "phase",
                "candidate",
                "decision",
                "canary queries",
                "decisive",
                "wins / losses / ties",
                "log-likelihood ratio",
                "threshold",
            ],
            rows,
        )
    }
    gates = []
    for phase, figures in record.get("phases", {}).items():
        for gate, verdict in figures.get("gates", {}).items():
            gates.append(
                [
                    phase,
                    gate,
                    num(verdict.get("criterion")),
                    num(verdict.get("passed")),
                    num(verdict.get("questions")),
                    num(verdict.get("production_ndcg@10")),
                    num(verdict.get("candidate_ndcg@10")),
                    signed(verdict.get("delta_ndcg@10")),
                    pvalue(verdict.get("p_value_ndcg@10")),
                    num(figures.get("candidate_ndcg@10")),
                ]
            )
    if gates:
        views["gates"] = (
            [
                "phase",
                "gate",
                "criterion",
                "passed",
                "held-out questions",
                "production nDCG@10",
                "candidate nDCG@10",
                "Δ",
                "p",
                "candidate's test nDCG@10 (if recorded)",
            ],
            gates,
        )
    served = [["dense nDCG@10 (production embedder)", num(record.get("ndcg@10_start")), num(record.get("ndcg@10_end"))]]
    if "served_ndcg@10_start" in record:
        served.append(
            [
                "as served (with the production reranker)",
                num(record.get("served_ndcg@10_start")),
                num(record.get("served_ndcg@10_end")),
            ]
        )
    views["test"] = (["SciFact test queries nobody asked", "start", "end"], served)
    return views


def paired_rows(paired: dict) -> list[list[str]]:
    return [
        [
            name,
            num(figures.get("n")),
            signed(figures.get("delta")),
            f"[{signed(figures.get('ci_low'))}, {signed(figures.get('ci_high'))}]",
            pvalue(figures.get("p_value")),
            f"{num(figures.get('better'))} / {num(figures.get('tied'))} / {num(figures.get('worse'))}",
        ]
        for name, figures in paired.items()
    ]


PAIRED_HEAD = ["comparison", "questions", "Δ", "95% CI", "p", "better / tied / worse"]


def canary_paired(record: dict) -> dict[str, Table]:
    arms = [[arm, num(value)] for arm, value in record.get("ndcg@10", {}).items()]
    return {"arms": (["arm", "test nDCG@10"], arms), "paired": (PAIRED_HEAD, paired_rows(record.get("paired", {})))}


def canary_rule(record: dict) -> dict[str, Table]:
    head = [
        "candidate's win share",
        "rule",
        "promoted",
        "rolled back on evidence",
        "rolled back at the horizon",
        "median canary queries",
        "mean",
    ]
    views: dict[str, Table] = {}
    for row in record.get("simulated", []):
        view = views.setdefault(f"ties-{row['tie_rate']:g}", (head, []))
        view[1].append(
            [
                f"{row['win_share']:.2f}",
                row["rule"],
                f"{row['promote']:.1%}",
                f"{row['rollback_on_evidence']:.1%}",
                f"{row['horizon']:.1%}",
                num(row["median_queries"]),
                num(row["mean_queries"], 1),
            ]
        )
    recorded = []
    for canary in record.get("recorded", []):
        logged = canary["logged"]
        for rule, replayed in canary["replayed"].items():
            recorded.append(
                [
                    Path(canary["data_dir"]).name,
                    f"{canary['kind']} {logged.get('candidate')}",
                    f"{logged.get('decision')} ({logged.get('wins')} / {logged.get('losses')} / {logged.get('ties')})",
                    rule,
                    replayed["decision"],
                    num(replayed["queries"]),
                    f"{replayed['wins']} / {replayed['losses']}",
                ]
            )
    views["recorded"] = (
        [
            "run",
            "canary",
            "logged decision (wins / losses / ties)",
            "rule",
            "replayed: decision",
            "after canary queries",
            "wins / losses then",
        ],
        recorded,
    )
    return views


def recanary(record: dict) -> dict[str, Table]:
    rows = []
    for label, phase in (
        ("the run's canary", record.get("run_canary")),
        *(("rerun", c) for c in get(record, "outcome", "canaries", default=[])),
    ):
        if not phase:
            continue
        ranking = phase.get("ranking_p95_ms") or {}
        rows.append(
            [
                label,
                num(phase.get("decision")),
                num(phase.get("canary_queries")),
                f"{phase.get('wins', '—')} / {phase.get('losses', '—')} / {phase.get('ties', '—')}",
                f"{ms(ranking.get('production'))} / {ms(ranking.get('canary'))}",
                phase.get("breaches") or "—",
            ]
        )
    head = ["canary", "decision", "canary queries", "wins / losses / ties", "ranking p95 production / canary", "breach"]
    truth = record.get("candidate_served") or {}
    served = [
        [metric, signed(truth[metric]["delta"]), pvalue(truth[metric]["p_value"])]
        for metric in ("ndcg@10", "recall@5")
        if metric in truth
    ]
    return {
        "canaries": (head, rows),
        "truth": (["candidate served on the run's scored human questions, vs before training", "Δ", "p"], served),
    }


def qa_chunking(record: dict) -> dict[str, Table]:
    rows = record.get("chunking", [])
    modes = [key.split(" ", 1)[1] for key in (rows[0] if rows else {}) if key.startswith("retrieval_score ")]
    views = {}
    for metric, label, digits in (
        ("retrieval_score", "RetrievalScore", 3),
        ("recall@5", "recall@5", 3),
        ("context_chars@5", "context chars@5", 0),
    ):
        views[metric] = (
            ["strategy", "chunks", "mean chars"] + [f"{label} {m}" for m in modes],
            [
                [r["strategy"], num(r.get("chunks")), num(r.get("mean_chars"))]
                + [num(r.get(f"{metric} {m}"), digits) for m in modes]
                for r in rows
            ],
        )
    return views


def question_style(record: dict) -> dict[str, Table]:
    columns = (
        ("n", "questions"),
        ("copy_share", "copies of a sentence"),
        ("mean_overlap", "content words in the paragraph"),
        ("mean_words", "words"),
        ("question_form_share", "question form"),
    )
    style = record.get("style", {})
    human = [k for k in style if "human" in k]
    rows = []
    for kind in [k for k in style if k not in human] + human:
        figures = style[kind]
        rows.append(
            [kind]
            + [
                f"{figures[key]:.0%}" if key.endswith("share") or key == "mean_overlap" else num(figures[key], 1)
                for key, _ in columns
            ]
        )
    generation = record.get("generation", {})
    views = {"style": (["kind"] + [label for _, label in columns], rows)}
    views["generation"] = (
        ["generated", "attempted", "fell back to another kind"],
        [[num(generation.get("questions")), num(generation.get("attempted")), num(generation.get("fallbacks"))]],
    )
    return views


def self_improvement(record: dict) -> dict[str, Table]:
    served_rows, paired, gates = [], [], []
    for name, corpus in record.get("corpora", {}).items():
        for label, figures in corpus.get("served", {}).items():
            who = corpus.get("served_versions", {}).get(label) or {}
            served_rows.append(
                [
                    name,
                    label,
                    str(who.get("embedder", "—")),
                    str(who.get("reranker", "—")),
                    num(figures.get("recall@5")),
                    num(figures.get("ndcg@10")),
                    num(figures.get("mrr@10")),
                ]
            )
        for label, metrics in corpus.get("paired_vs_former_default", {}).items():
            paired += [[f"{name}: {label}, {metric}"] + row[1:] for metric, row in zip(metrics, paired_rows(metrics))]
        for gate, verdict in get(corpus, "retrain", "gates", default={}).items():
            gates.append(
                [
                    name,
                    gate,
                    str(verdict.get("outcome", verdict.get("passed")))
                    + (GENERATED_ONLY if verdict.get("better_on_generated") else ""),
                    num(verdict.get("questions")),
                    num(verdict.get("copied_questions_set_aside")),
                    signed(verdict.get("delta_ndcg@10")),
                    pvalue(verdict.get("p_value_ndcg@10")),
                ]
            )
    canaries = [
        [
            name,
            str(phase.get("kind")),
            str(phase.get("candidate_version")),
            str(phase.get("decision") or "no decision"),
            num(phase.get("asked")),
            num(phase.get("canary_queries")),
            f"{num(phase.get('wins'))} / {num(phase.get('losses'))}",
            num(phase["queries_to_decide"])
            if phase.get("queries_to_decide")
            else ("none within 10 million" if "queries_to_decide" in phase else "—"),
            str(phase.get("evidence") or phase.get("last_evidence") or "—"),
        ]
        for name, corpus in record.get("corpora", {}).items()
        for phase in corpus.get("canaries", [])
    ]
    candidates = [
        [
            name,
            label,
            num(get(figures, "scores", "recall@5")),
            num(get(figures, "scores", "ndcg@10")),
        ]
        + [
            f"{signed(paired.get('delta'))} [{signed(paired.get('ci_low'))}, {signed(paired.get('ci_high'))}], "
            f"p {pvalue(paired.get('p_value'))}"
            for metric in ("recall@5", "ndcg@10")
            for paired in [get(figures, "paired_vs_before_training", metric, default={})]
        ]
        for name, corpus in record.get("corpora", {}).items()
        for label, figures in corpus.get("candidates_served", {}).items()
    ]
    views = {"served": (["corpus", "served", "embedder", "reranker", "recall@5", "nDCG@10", "MRR@10"], served_rows)}
    if candidates:
        views["candidates"] = (
            [
                "corpus",
                "trained candidate, served",
                "recall@5",
                "nDCG@10",
                "Δ recall@5 vs before training [95% CI]",
                "Δ nDCG@10 vs before training [95% CI]",
            ],
            candidates,
        )
    if canaries:
        views["canaries"] = (
            [
                "corpus",
                "kind",
                "candidate",
                "decision",
                "users' questions asked",
                "canary queries",
                "wins / losses",
                "canary queries to decide at these rates",
                "why",
            ],
            canaries,
        )
    if paired:
        views["paired"] = (["vs the former default"] + PAIRED_HEAD[1:], paired)
    if gates:
        views["gates"] = (["corpus", "gate", "outcome", "questions", "copies set aside", "Δ nDCG@10", "p"], gates)
    return views


GENERATED_ONLY = " (better on generated questions only)"  # GateSettings.generated_<kind>_gain held it back


# Runs before bench/loop.py recorded its headline figure led with these.
LOOP_HEADLINE = {"tatqa": "recall@5", "scifact": "ndcg@10", "conditionalqa": "recall@5", "squad": "recall@5"}
# bench/loop.py's figures over the served passages' documents, each counted once where its first passage comes.
LOOP_METRIC_LABEL = {"doc_ndcg@10": "nDCG@10 by document", "doc_recall@5": "recall@5 by document"}


def _serving(entry: dict) -> str:
    served, production = entry.get("served") or {}, entry.get("production") or {}
    return (
        f"{served.get('strategy', '?')} · {served.get('mode', '?')}; embedder {served.get('embedder') or '?'}, "
        f"reranker {served.get('reranker') or 'none'}"
        + (f" ({production['configuration']})" if production.get("configuration") else "")
    )


def _rerankers_on_test(candidates: list[dict], metric: str, kind: str = "reranker") -> Table:
    """Every reranker (or embedder, `kind`) a loop run trained, scored on its test split whatever its gate and canary
    said; an embedder no canary built a collection for is listed unscored."""
    rows = []
    for row in candidates:
        paired = (row.get("paired_vs_untrained_default") or {}).get(metric) or {}
        gate = row.get("gate") or {}
        rows.append(
            [
                row["name"],
                f"{gate.get('outcome') or '—'} ({num(gate.get('questions'))} questions)",
                row.get("canary") or "—",
                num(row["scores"].get(metric)) if row.get("scores") else "not scored (no collection)",
                f"{signed(paired.get('delta'))} ({pvalue(paired.get('p_value'))})" if paired else "—",
            ]
        )
    label = LOOP_METRIC_LABEL.get(metric, metric)
    return (
        [f"{kind} (oracle view: scored on the test split)", "gate", "canary", label, "Δ vs untrained default (p)"],
        rows,
    )


def loop_candidates(record: dict) -> dict[str, Table]:
    """bench/loop_candidates.py: a finished loop run's rerankers on its test split."""
    corpus = record.get("corpus", {})
    metric = corpus.get("headline") or LOOP_HEADLINE.get(corpus.get("corpus"), "recall@5")
    views = {"rerankers": _rerankers_on_test(corpus.get("rerankers_on_test", []), metric)}
    if corpus.get("embedders_on_test"):
        views["embedders"] = _rerankers_on_test(corpus["embedders_on_test"], metric, kind="embedder")
    return views


def canary_credit(record: dict) -> dict[str, Table]:
    """bench/canary_credit.py: the loop runs' canary queries counted under each credit rule (the rules a file has)."""

    def cell(row: dict) -> str:
        return f"{row['wins']}:{row['losses']} ({row['log_likelihood_ratio']:+.2f})"

    labels = {
        "positive": "clicks and +1s (decided until 2026-11-30)",
        "signed": "with −1 debits (decided before that)",
        "negative": "−1s alone",
        "plain": "plain team draft",
        "confirmed": "clicks and +1s, bare clicks left out where a passage was rated +1 (decides now)",
        "ratings": "+1s alone",
        "ratings first": "+1s, bare clicks breaking their ties",
    }
    splits = [split for run in record.get("runs", []) for split in run["interleaved"].values()]
    rules = [rule for rule in labels if splits and all(rule in split for split in splits)]
    rows = []
    for run in record.get("runs", []):
        deltas = [
            d["mrr@10"]["delta"]
            for r in run.get("rerankers_on_test", [])
            if (d := r.get("paired_vs_untrained_default") or {}).get("mrr@10")
        ]
        known = f"{signed(min(deltas))} to {signed(max(deltas))}" if deltas else "—"
        for split in run["interleaved"].values():
            rows.append(
                [
                    f"`{run['source']}` ({short_commit(run.get('source_commit'))})",
                    ", ".join(run.get("canaries") or []) or "—",
                    *(cell(split[rule]) for rule in rules),
                    known,
                ]
            )
    header = ["loop run", "canaries", *(labels[rule] for rule in rules), "its rerankers on test, Δ MRR@10"]
    return {"runs": (header, rows)}


def gate_folds(record: dict) -> dict[str, Table]:
    """bench/gate_folds.py: finished loop runs' rankers gated again, on their own share and cross-fitted."""
    rows = []
    for run in record.get("runs", []):
        metric = run.get("headline") or "recall@5"
        for v in run.get("verdicts", []):
            shares = v.get("gate_questions_by_fold")
            rows.append(
                [
                    f"`{run['source']}`",
                    v["candidate"],
                    v["against"],
                    v["questions_from"] + (f" ({' + '.join(str(n) for n in shares.values())})" if shares else ""),
                    f"{v.get('changed_questions', '—')} of {v['questions']}",
                    f"{signed(v.get('delta_ndcg@10'))} ({pvalue(v.get('p_value_ndcg@10'))})",
                    f"{signed(v.get('delta_mrr@10'))} ({pvalue(v.get('p_value_mrr@10'))})",
                    v["outcome"],
                    f"{metric} {signed(v.get('on_test_delta_vs_untrained'))} ({pvalue(v.get('on_test_p_value'))})"
                    if v.get("on_test_delta_vs_untrained") is not None
                    else "—",
                ]
            )
    header = [
        "loop run",
        "candidate",
        "against",
        "gate questions",
        "changed",
        "Δ nDCG@10 (p)",
        "Δ MRR@10 (p)",
        "verdict",
        "on test vs untrained default (p)",
    ]
    return {"verdicts": (header, rows)}


def loop(record: dict) -> dict[str, Table]:
    """bench/loop.py: the served pipeline after each round of people's questions, paired against round 0."""
    corpus = record.get("corpus", {})
    metric = corpus.get("headline") or LOOP_HEADLINE.get(corpus.get("corpus"), "recall@5")
    rounds = []
    first = corpus.get("round_0")
    read = "answer_read"  # whether the passages the answer reads hold it (runs before it was scored show —)

    def read_cells(entry: dict) -> list[str]:
        paired = get(entry, "paired_vs_untrained_default", read, default={}) or {}
        delta = f"{signed(paired['delta'])} ({pvalue(paired.get('p_value'))})" if paired else "—"
        return [num(entry["scores"].get(read)) if read in entry["scores"] else "—", delta]

    if first:
        rounds.append(["0", "0", _serving(first), "—", num(first["scores"].get(metric)), "—", "—", *read_cells(first)])
    gates, runs, canaries = [], [], []
    for entry in corpus.get("rounds", []):
        paired = get(entry, "paired_vs_untrained_default", metric, default={}) or {}
        jobs = [op for op in entry.get("operations", []) if "job" in op]
        said = [op.get("skip") for op in entry.get("operations", []) if op.get("sensor") == "canary_sensor"]
        if said and said[-1] and said[-1].startswith("canary "):
            canaries.append([str(entry["round"]), said[-1].split(", log-likelihood")[0]])
        rounds.append(
            [
                str(entry["round"]),
                num(entry.get("asked_total")),
                _serving(entry),
                "; ".join(f"{op['job']}{'' if op['success'] else ' (failed)'}" for op in jobs) or "—",
                num(entry["scores"].get(metric)),
                f"{signed(paired.get('delta'))} [{signed(paired.get('ci_low'))}, {signed(paired.get('ci_high'))}]",
                pvalue(paired.get("p_value")),
                *read_cells(entry),
            ]
        )
        for op in jobs:
            for check, verdict in op.get("checks", {}).items():
                gates.append(
                    [
                        str(entry["round"]),
                        check,
                        str(verdict.get("outcome", verdict.get("passed"))),
                        num(verdict.get("questions")),
                        signed(verdict.get("delta_ndcg@10")),
                        pvalue(verdict.get("p_value_ndcg@10")),
                    ]
                )
            for asset, released in op.get("released", {}).items():
                said = released.get("summary") or released.get("reason")  # a rollback or promotion gives its reason
                if said:
                    runs.append([str(entry["round"]), op["job"], asset, said])
    views = {
        "rounds": (
            [
                "round",
                "people's questions",
                "serving",
                "jobs the sensors ran",
                LOOP_METRIC_LABEL.get(metric, metric),
                "Δ vs round 0 [95% CI]",
                "p",
                "answer in what the answer reads",
                "Δ (p)",
            ],
            rounds,
        ),
        "gates": (["round", "gate", "outcome", "held-out questions", "Δ nDCG@10", "p"], gates),
        "canaries": (["round", "canary at the round's end (canary_sensor)"], canaries),
        "releases": (["round", "job", "asset", "what it did"], runs),
    }
    experts = [entry for entry in corpus.get("rounds", []) if "experts" in entry]
    if experts:  # runs with --expert-labels: what the simulated expert graded after each round
        views["experts"] = (
            ["round", "queue items", "labelled", "graded relevant", "skipped (no person's question)"],
            [
                [str(e["round"]), "no queue" if e["experts"].get("no_queue") else num(e["experts"]["queue_size"])]
                + [num(e["experts"][k]) for k in ("labelled", "relevant", "skipped")]
                for e in experts
            ],
        )
    if corpus.get("rerankers_on_test"):  # every reranker the loop trained, scored on the test split
        views["rerankers_on_test"] = _rerankers_on_test(corpus["rerankers_on_test"], metric)
    if corpus.get("embedders_on_test"):  # every embedder a canary built a collection for, scored on the test split
        views["embedders_on_test"] = _rerankers_on_test(corpus["embedders_on_test"], metric, kind="embedder")
    ceiling = corpus.get("ceiling")
    if ceiling:  # runs with --ceiling: the learner's grid on the test labels
        grid = ceiling["configurations"]
        shown, chunk_sets = grid[:5], {r["configuration"].split(" · ")[0] for r in grid[:5]}
        for row in grid[5:]:  # and the best of every other chunk set
            if row["configuration"].split(" · ")[0] not in chunk_sets:
                chunk_sets.add(row["configuration"].split(" · ")[0])
                shown.append(row)
        views["ceiling"] = (
            ["configuration (oracle: scored on the test labels)", "answer in what the answer reads", "recall@5"],
            [[r["configuration"], num(r["answer_read"]), num(r["recall@5"])] for r in shown],
        )
    return views


def _loop_learners(row: dict) -> str:
    """The learners of a loop run, the reranker's marked with its features where the learner had document ones."""
    return " + ".join(
        "reranker (document features)"
        if kind == "reranker" and row.get("reranker_learner") == "document features"
        else kind
        for kind in row.get("learners") or []
    )


def loop_ablation(record: dict) -> dict[str, Table]:
    """bench/loop_ablation.py: one row per full loop run, the last round against the untrained default."""

    def paired(row: dict, metric: str) -> str:
        p = (row.get("paired") or {}).get(metric)
        return f"{signed(p['delta'])} ({pvalue(p.get('p_value'))})" if p else "—"

    runs = []
    for row in record.get("runs", []):
        metric, people = (
            row["metric"],
            row["behaviour"]
            + (f", canary judged {row['canary_behaviour']}" if row.get("canary_behaviour") else "")
            + (f"; an expert graded {num(row['expert_labels'])} pairs" if row.get("expert_labels") else ""),
        )
        served = ", ".join(f"{kind} {v}" for kind, v in (row.get("production") or {}).items() if v)
        runs.append(
            [
                row["corpus"],
                _loop_learners(row),
                people,
                num(row.get("people_questions")),
                served or "untrained default" + (" (a canary running)" if row.get("canary_running") else ""),
                f"{LOOP_METRIC_LABEL.get(metric, metric)} {num(row['last_round'].get(metric))}",
                paired(row, metric),
                paired(row, "answer_read"),
                f"`{row['source']}` ({short_commit(row.get('source_commit'))})",
            ]
        )
    return {
        "targets": (
            [
                "corpus",
                "asked",
                "full runs that served it",
                "runs that trained a model that would have served it",
                "best run at the round judged: served, headline, Δ [95% CI] (p)",
                "of the models the runs trained by then, the best (of harmful people's, the worst): Δ (p)",
                "reranker on complete labels of people's questions: Δ (p)",
            ],
            [_ablation_target(row) for row in record.get("targets", [])],
        ),
        "runs": (
            [
                "corpus",
                "learners",
                "people",
                "people's questions",
                "served at the end",
                "headline",
                "Δ vs untrained default (p)",
                "Δ answer read (p)",
                "result file",
            ],
            runs,
        ),
        "corrections": (
            [
                "corpus",
                "learners",
                "people's questions",
                "share of failed questions corrected",
                "corrections sent",
                "served at the end",
                "Δ recall@5 vs untrained default (p)",
                "Δ answer read (p)",
                "result file",
            ],
            [
                [
                    row["corpus"],
                    _loop_learners(row),
                    num(row.get("people_questions")),
                    f"{row['p_correction']:.0%}" if row.get("p_correction") is not None else "—",
                    num(row.get("corrections_sent")),
                    ", ".join(f"{kind} {v}" for kind, v in (row.get("production") or {}).items() if v)
                    or "untrained default",
                    paired(row, "recall@5"),
                    paired(row, "answer_read"),
                    f"`{row['source']}`",
                ]
                for row in record.get("corrections", [])
            ],
        ),
        "ceilings": (
            [
                "corpus",
                "untrained default: headline / answer read",
                "recall of the 10 passages served",
                "best configuration on the test labels: answer read",
                "first stage recall down to the rerank depth",
                "reranker on complete labels of people's questions: Δ headline (p)",
                "reranker trained on the test labels (oracle): Δ headline (p)",
            ],
            [_ablation_ceiling(row) for row in record.get("ceilings", [])],
        ),
    }


def reranker_ceiling(record: dict) -> dict[str, Table]:
    """bench/reranker_ceiling.py: the loop's reranker learner on complete labels, scored on the test split."""
    corpus = record.get("corpus") or {}
    metric = corpus.get("headline", "recall@5")
    label = LOOP_METRIC_LABEL.get(metric, metric)
    first, base = corpus.get("first_stage") or {}, (corpus.get("untrained_default") or {}).get("scores") or {}
    depth = first.get("depth", 50)
    rows = [["untrained default (no reranker)", "—", num(base.get(metric)), "—", num(base.get("answer_read")), "—"]]
    for arm in corpus.get("arms", []):
        scores, paired = arm["scores"], arm["paired_vs_untrained_default"]
        r, a = paired[metric], paired["answer_read"]
        rows.append(
            [
                _ceiling_arm_label(arm)
                if arm["arm"].startswith("clicks-")
                else "the test questions' own labels (an oracle)"
                if arm["arm"] == "test-in-sample"
                else f"the first {num(arm['questions'])} people's questions"
                + (
                    f", generated questions mixed in ({num(arm['generated_pairs'])} pairs)"
                    if arm["arm"].endswith("+generated")
                    else ""
                )
                + "".join(f", {change}" for change in _learner_changes(arm)),
                f"{num(arm['training_questions'])} / {num(arm['selection_questions'])}",
                num(scores[metric]),
                f"{signed(r['delta'])} [{signed(r['ci_low'])}, {signed(r['ci_high'])}] ({pvalue(r['p_value'])})",
                num(scores["answer_read"]),
                f"{signed(a['delta'])} ({pvalue(a['p_value'])})",
            ]
        )
    return {
        "first_stage": (
            ["first stage of the untrained default", "recall@5", "recall@10", "recall@20", f"recall@{depth}"],
            [["hybrid-cc, paragraph chunks, MiniLM"] + [num(first.get(f"recall@{k}")) for k in (5, 10, 20, depth)]],
        ),
        "arms": (
            [
                "reranker trained on complete labels of",
                "questions: training / selection",
                label,
                f"Δ {label} [95% CI] (p)",
                "answer read",
                "Δ answer read (p)",
            ],
            rows,
        ),
    }


def _ceiling_arm_label(arm: dict) -> str:
    """A clicks arm of bench/reranker_ceiling.py: not complete labels, but what people gave (and those completed)."""
    asked = num(arm["questions"])
    if arm["arm"].endswith("liked-complete"):
        return f"the {num(arm['liked'])} of the first {asked} people's questions with a liked passage (and corrections)"
    return f"not complete: what people clicked, rated and corrected for the first {asked} people's questions"


def _learner_changes(arm: dict) -> list[str]:
    """The learner settings an ablation arm of bench/reranker_ceiling.py changed, in words."""
    return [
        f"without {key.replace('_', ' ')}" if value is False else f"{key.replace('_', ' ')} {value}"
        for key, value in (arm.get("learner_options") or {}).items()
    ]


def _ablation_drill(row: dict) -> list[str]:
    """The harm drills' row of the targets: how many rolled the harmful model's canary back in time, the quickest."""
    label = LOOP_METRIC_LABEL.get(row["metric"], row["metric"])
    ended = [d for d in row["drills"] if d.get("outcome")]
    first = min(ended, key=lambda d: d["after_questions"]) if ended else None
    best_cell = (
        f"{first['outcome'].replace('_', ' ')} after {num(first['after_questions'])} people's questions "
        f"({num(first['canary_queries'])} served by its canary; `{first['source']}`)"
        if first
        else "no drill's canary ended"
    )
    worst = min((d for d in row["drills"] if d.get("on_test")), key=lambda d: d["on_test"]["delta"], default=None)
    trained_cell = (
        f"the drill's model: {worst['candidate']}, {label} {signed(worst['on_test']['delta'])} "
        f"({pvalue(worst['on_test']['p_value'])}), its gate {worst['gate']['outcome']} (`{worst['source']}`)"
        if worst
        else "—"
    )
    return [row["corpus"], row["asked"], f"{len(row['reached'])} of {row['runs']}", "—", best_cell, trained_cell, "—"]


def _ablation_target(row: dict) -> list[str]:
    """A figure issue 48 asked of the loop, with how many full runs reached it, the best of them and the ceilings."""
    if row.get("drill"):
        return _ablation_drill(row)
    metric, best, trained, complete = row["metric"], row["best_run"], row.get("trained"), row.get("complete_labels")
    label, level = LOOP_METRIC_LABEL.get(metric, metric), row.get("level") is not None
    paired = best.get("paired") or {}
    served = ", ".join(f"{kind} {v}" for kind, v in (best.get("production") or {}).items() if v)
    if row.get("nothing_promoted"):
        best_cell = f"untrained default served at the end of {len(row['reached'])} of {row['runs']} runs"
    else:
        best_cell = (
            f"{served or 'untrained default'}; {label} {num(best.get(metric))}, {signed(paired.get('delta'))} "
            f"[{signed(paired.get('ci_low'))}, {signed(paired.get('ci_high'))}] ({pvalue(paired.get('p_value'))}) "
            f"after {num(best.get('people_questions'))} questions (`{best['source']}`)"
        )
    trained_cell = "—"
    if trained:
        tp = trained["paired"]
        reads = f"{label} {num(trained['score'])}, " if level and trained.get("score") is not None else ""
        trained_cell = (
            f"{trained['which']}: {trained['name']}, {reads}{signed(tp['delta'])} ({pvalue(tp['p_value'])}), "
            f"its gate {trained['gate']} (`{trained['source']}`)"
        )
    complete_cell = "—"
    if complete and not row.get("nothing_promoted"):
        reads = f"{label} {num(complete['score'])}, " if level and complete.get("score") is not None else ""
        complete_cell = (
            f"{reads}{signed(complete['delta'])} ({pvalue(complete['p_value'])}), {num(complete['questions'])} "
            "questions"
        )
    could = "—" if row.get("nothing_promoted") else f"{len(row.get('trained_reaching') or [])} of {row['runs']}"
    served_it = f"{len(row['reached'])} of {row['runs']}"
    return [row["corpus"], row["asked"], served_it, could, best_cell, trained_cell, complete_cell]


def _ablation_ceiling(row: dict) -> list[str]:
    metric, rr = row["metric"], row.get("reranker") or {}

    def arm(key: str) -> str:
        got = rr.get(key)
        return f"{signed(got['delta'])} ({pvalue(got['p_value'])}), {num(got['questions'])} questions" if got else "—"

    return [
        row["corpus"],
        f"{LOOP_METRIC_LABEL.get(metric, metric)} {num(row['round_0'].get(metric))} / "
        f"{num(row['round_0'].get('answer_read'))}",
        num(row.get("served_recall@10")),
        f"{row['best_configuration']}: {num(row['best_configuration_answer_read'])}"
        if row.get("best_configuration")
        else "— (no run with --ceiling)",
        f"{num(rr['first_stage_recall_at_depth'])} (top {rr['rerank_depth']})" if rr else "— (not run)",
        arm("complete_users_labels"),
        arm("in_sample_oracle"),
    ]


def gate_calibration(record: dict) -> dict[str, Table]:
    rows = []
    for name, corpus in record.get("corpora", {}).items():
        for candidate in corpus.get("candidates", []):
            gate, true = candidate["gate"], candidate["true_effect"]
            ci = (
                f" [{signed(gate['ci_low_ndcg@10'], 3)}, {signed(gate['ci_high_ndcg@10'], 3)}]"
                if "ci_low_ndcg@10" in gate
                else ""
            )
            rows.append(
                [
                    name,
                    candidate["candidate"],
                    f"{gate['outcome']}{GENERATED_ONLY if gate.get('better_on_generated') else ''}"
                    f" ({gate.get('questions', 0)})",
                    signed(gate.get("delta_ndcg@10"), 3) + ci,
                    f"{signed(true['recall@5']['delta'], 3)} ({pvalue(true['recall@5']['p_value'])})",
                    f"{signed(true['ndcg@10']['delta'], 3)} ({pvalue(true['ndcg@10']['p_value'])})",
                ]
            )
    views = {
        "candidates": (
            [
                "corpus",
                "candidate",
                "gate (questions)",
                "gate Δ nDCG@10 [95% CI]",
                "true Δ recall@5 (p)",
                "true Δ nDCG@10 (p)",
            ],
            rows,
        )
    }
    summary = record.get("summary")
    if summary:
        threshold = signed(summary.get("true_gain_threshold"), 2)
        header = ["candidates", "passed the gate", "passed with a true recall@5 loss (p < 0.05)"]
        row = [
            str(summary.get("candidates", 0)),
            str(summary.get("accepted", 0)),
            ", ".join(summary.get("accepted_with_a_true_loss", [])) or "none",
        ]
        if "accepted_with_a_true_ndcg_loss" in summary:  # runs before it was summarised show no such column
            header.append("passed with a true nDCG@10 loss (p < 0.05)")
            row.append(", ".join(summary["accepted_with_a_true_ndcg_loss"]) or "none")
        header += [f"true recall@5 gains ≥ {threshold} (p < 0.05)", "of them rejected"]
        row += [str(summary.get("true_gains", 0)), ", ".join(summary.get("true_gains_rejected", [])) or "none"]
        if "true_gains_held_for_the_canary" in summary:  # runs before it was summarised show no such column
            header.append("of them held for the canary")
            row.append(", ".join(summary["true_gains_held_for_the_canary"]) or "none")
        views["summary"] = (header, [row])
    return views


def replica_swap(record: dict) -> dict[str, Table]:
    rows = []
    for run in record.get("runs", []):
        for path in run.get("paths", []):
            refreshes = path.get("refresh", [])
            seconds = [r["refresh_s"] for r in refreshes if "refresh_s" in r]
            availability = path.get("availability", {})
            rows.append(
                [
                    num(run["points"]),
                    path["path"],
                    num(get(path, "cold", "refresh_s"), 2),
                    f"{min(seconds):.2f}–{max(seconds):.2f}" if seconds else "—",
                    f"{min(r['copy_s'] for r in refreshes):.2f}–{max(r['copy_s'] for r in refreshes):.2f}"
                    if refreshes
                    else "—",
                    f"{min(r['open_s'] for r in refreshes):.2f}–{max(r['open_s'] for r in refreshes):.2f}"
                    if refreshes
                    else "—",
                    num(availability.get("errors")),
                    ms(get(availability, "baseline", "max_gap_ms")),
                    ms(get(availability, "during_refresh", "max_gap_ms")),
                ]
            )
    return {
        "refresh": (
            [
                "points",
                "copy path",
                "first copy s",
                "refresh s",
                "of it: file copy s",
                "open s",
                "probe errors",
                "longest gap between answers, idle ms",
                "during a refresh ms",
            ],
            rows,
        )
    }


def replica_open_pause(record: dict) -> dict[str, Table]:
    steps = []
    for repeat in record.get("repeats", []):
        steps += [s for s in repeat if s not in steps]
    rows = [
        [step]
        + [
            f"{get(r, step, 'seconds', default=0):.3f} s / {get(r, step, 'max_gap_ms', default=0):.1f} ms"
            for r in record.get("repeats", [])
        ]
        for step in steps
    ]
    rows.append(
        ["no step (baseline)"] + [f"— / {ms(record.get('baseline_max_gap_ms'))} ms"] * len(record.get("repeats", []))
    )
    return {
        "steps": (
            ["step"] + [f"repeat {i + 1}: seconds / longest gap" for i in range(len(record.get("repeats", [])))],
            rows,
        )
    }


def retrieval(record: dict) -> dict[str, Table]:
    views: dict[str, Table] = {}
    ndcg = get(record, "quality", "ndcg@10")
    if ndcg:
        views["ndcg"] = (["mode", "SciFact test nDCG@10"], [[mode, num(value)] for mode, value in ndcg.items()])
    sweep = get(record, "quality", "alpha_train_sweep")
    if sweep:
        views["alpha"] = (
            ["α (dense weight)", "hybrid-cc nDCG@10 on SciFact train"],
            [[alpha, num(value)] for alpha, value in sweep.items()],
        )
    throughput = record.get("throughput")
    if throughput:
        views["throughput"] = (
            ["texts", "pipeline chunks/s", "model.encode texts/s", "ratio"],
            [
                [
                    num(throughput.get("texts")),
                    num(throughput.get("pipeline_per_s"), 1),
                    num(throughput.get("encode_per_s"), 1),
                    num(throughput.get("ratio"), 2),
                ]
            ],
        )
    latency = record.get("latency")
    if latency:
        modes = sorted({m for figures in latency.values() for m in figures})
        views["latency"] = (
            ["points"] + [f"{m} p50/p95 ms" for m in modes],
            [[size] + [p50_p95(figures.get(m)) for m in modes] for size, figures in latency.items()],
        )
    incremental = record.get("incremental")
    if incremental:
        rows = [
            [
                share,
                num(get(incremental, share, "updated")),
                num(get(incremental, share, "seconds"), 2),
                num(get(incremental, share, "ratio"), 4),
            ]
            for share in ("1%", "10%")
            if share in incremental
        ]
        rows.append(["full build", num(incremental.get("documents")), num(incremental.get("full_build_s"), 1), "1"])
        views["incremental"] = (["documents changed", "documents", "seconds", "share of a full build"], rows)
    return views


def active_learning(record: dict) -> dict[str, Table]:
    views: dict[str, Table] = {}
    for name, corpus in record.get("corpora", {}).items():
        by_budget = get(corpus, "comparison", "by_budget", default={})
        budgets = list(by_budget)
        methods = sorted({m for b in budgets for m in by_budget[b].get("mean_ndcg@10", {})})
        rows = [
            [f"{method} (test nDCG@10, mean over seeds)"]
            + [num(by_budget[b]["mean_ndcg@10"].get(method)) for b in budgets]
            for method in methods
        ]
        for method in methods:
            found = [get(by_budget[b], "relevant_labels", method) for b in budgets]
            if any(f is not None for f in found):
                rows.append([f"{method}: relevant labels"] + [num(f, 1) for f in found])
        versus = [by_budget[b].get("active_vs_random") for b in budgets]
        if any(versus):
            rows.append(
                ["active − random [95% CI]"]
                + [
                    "—" if v is None else f"{signed(v['delta'])} [{signed(v['ci_low'])}, {signed(v['ci_high'])}]"
                    for v in versus
                ]
            )
        rows.append(["base (no labels)"] + [num(get(corpus, "base", "ndcg@10"))] * len(budgets))
        views[name] = ([f"{name}: {corpus.get('note', '')}".replace("|", "/")] + [f"{b} labels" for b in budgets], rows)
    return views


def answers(record: dict) -> dict[str, Table]:
    spans = record.get("spans", {})
    stages = ("retrieve", "generate", "attribute", "total")
    quality, timing = [], []
    for label, run in spans.get("runs", {}).items():
        setting = (
            f"{run.get('model', '—')}, lead-ins {'continued' if run.get('continue_lead_ins') else 'not continued'}, "
            f"sentence vectors {'stored' if run.get('sentence_store') else 'encoded per question'}"
        )
        if run.get("query_encoder") == "int8":
            setting += ", question encoded by the int8 twin"
        if run.get("sentence_encoder") == "int8":
            setting += ", sentence vectors by the int8 twin"
        paired = spans.get("paired_f1_vs_before", {}).get(label)
        versus = "—" if not paired else f"{signed(paired['delta'])} (p {num(paired['p_value'], 3)})"
        quality.append(
            [
                label,
                setting,
                num(run.get("exact_match")),
                num(run.get("f1")),
                versus,
                num(run.get("coverage"), 2),
                num(run.get("continued_answers")),
                num(run.get("mean_answer_chars"), 0),
            ]
        )
        timing.append([label] + [p50_p95(run.get("stages", {}).get(stage)) for stage in stages])
    views = {
        "spans": (
            [
                "run",
                "setting",
                "exact match",
                "F1",
                "F1 − before (paired t-test)",
                "answered",
                "continued answers",
                "mean answer characters",
            ],
            quality,
        ),
        "stages": (["run"] + [f"{stage} p50/p95 ms" for stage in stages], timing),
    }
    encode = spans.get("sentence_encode") or {}
    versus_after = [
        [
            label,
            f"{signed(p['delta'])} [{signed(p['ci_low'])}, {signed(p['ci_high'])}], p {num(p['p_value'], 3)}",
            f"{p.get('better')}/{p.get('tied')}/{p.get('worse')}",
            num(encode.get("sentences")),
            num(encode.get("model_seconds"), 1),
            num(encode.get("int8_seconds"), 1),
        ]
        for label, p in spans.get("paired_f1_vs_after", {}).items()
    ]
    if versus_after:  # int8 twin sentence vectors, all else as in "after" (AnswerSettings.sentence_encoder)
        views["int8-sentences"] = (
            [
                "run",
                "F1 − after [95% CI], paired t-test",
                "better/tied/worse",
                "sentences",
                "encode s, model",
                "encode s, int8 twin",
            ],
            versus_after,
        )
    return views


def load_api(record: dict) -> dict[str, Table]:
    stages = ("retrieve", "generate", "attribute", "total")
    rows = []
    for phase in record.get("phases", []):
        ask = phase.get("ask", {})
        medians = phase.get("stage_medians_ms", {})
        rows.append(
            [
                str(phase.get("clients")),
                "yes" if phase.get("reindex") else "no",
                num(phase.get("requests_per_s"), 1),
                ms(ask.get("p50_ms")),
                ms(ask.get("p95_ms")),
                ms(ask.get("p99_ms")),
                ms(ask.get("max_ms")),
                num(phase.get("errors")),
            ]
            + [ms(medians.get(stage)) for stage in stages]
        )
    head = ["clients", "re-indexing", "req/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors"]
    views = {"phases": (head + [f"server {stage} median ms" for stage in stages], rows)}
    split = [
        [str(phase.get("clients")), "yes" if phase.get("reindex") else "no"]
        + [
            cell
            for key in ("ask_new_questions", "ask_repeated_questions")
            for cell in (
                num(get(phase, key, "n")),
                ms(get(phase, key, "p50_ms")),
                ms(get(phase, key, "p95_ms")),
            )
        ]
        for phase in record.get("phases", [])
        if "ask_new_questions" in phase
    ]
    if split:
        views["questions"] = (
            [
                "clients",
                "re-indexing",
                "first asks",
                "first asks p50 ms",
                "first asks p95 ms",
                "repeated asks",
                "repeated p50 ms",
                "repeated p95 ms",
            ],
            split,
        )
    targets, met = record.get("targets", {}), record.get("meets_targets", {})
    views["targets"] = (
        ["target", "value", "met"],
        [[key.replace("_", " "), num(value, 1), num(met.get(key))] for key, value in sorted(targets.items())],
    )
    check = record.get("store_check")
    if check:
        views["store"] = (
            ["answered asks", "queries stored", "lost", "integrity problems"],
            [
                [
                    num(check.get("asks_answered")),
                    num(check.get("queries_stored")),
                    num(check.get("lost")),
                    num(len(check.get("integrity_problems", []))),
                ]
            ],
        )
    return views


def encoder_int8(record: dict) -> dict[str, Table]:
    arms = (
        ("float", "float queries, float passages"),
        ("int8_queries_over_float_passages", "int8 queries, float passages (query_encoder: int8)"),
        ("int8", "int8 queries, int8 passages (minilm-int8 collections)"),
    )
    rows = []
    for dataset, figures in record.get("quality", {}).items():
        paired = figures.get("paired_ndcg@10_vs_float", {})
        for key, label in arms:
            versus = paired.get(key)
            rows.append(
                [
                    f"{dataset} ({num(figures.get('queries'))} questions, {num(figures.get('passages'))} passages)",
                    label,
                    num(get(figures, key, "ndcg@10")),
                    num(get(figures, key, "recall@100")),
                    "—"
                    if not versus
                    else f"{signed(versus['delta'])} [{signed(versus['ci_low'])}, {signed(versus['ci_high'])}], "
                    f"p {num(versus['p_value'], 3)}",
                ]
            )
    views = {
        "quality": (
            ["dataset", "vectors", "dense nDCG@10", "recall@100", "nDCG@10 − float [95% CI], paired t-test"],
            rows,
        )
    }
    models = record.get("models", {})
    views["speed"] = (
        ["model", "one question p50 ms", "p95 ms", "passages/s (batches)"],
        [
            [
                str(m.get("name")),
                ms(get(m, "query_latency", "p50_ms")),
                ms(get(m, "query_latency", "p95_ms")),
                num(get(m, "batch", "passages_per_second"), 1),
            ]
            for m in models.values()
        ],
    )
    return views


def indexing(record: dict) -> dict[str, Table]:
    """bench/indexing.py: index_folder's stages from nothing to served, and the same texts encoded bare."""
    corpus = record.get("corpus", {})
    stages = []
    for row in record["stages"]:
        rate = "—" if row.get("per_s") is None else f"{num(float(row['per_s']), 1)} {row['unit']}/s"
        stages.append(
            [
                row["stage"],
                row.get("strategy") or "—",
                num(row.get("items")),
                num(float(row["seconds"]), 2),
                rate,
                num(row.get("mb_per_s"), 3),
                num(row.get("peak_rss_mb"), 0),
            ]
        )
    total = record.get("total", {})
    stages.append(
        ["from nothing to served", "", "", num(total.get("seconds"), 2), "", "", num(total.get("peak_rss_mb"), 0)]
    )
    encode = []
    for strategy, bare in record.get("bare", {}).items():
        for texts, stage in (("chunks", "chunk vectors"), ("sentences", "sentence vectors")):
            row = next((r for r in record["stages"] if r["stage"] == stage and r.get("strategy") == strategy), None)
            if row is None:
                continue
            by = get(record, "model", "name") if texts == "chunks" else get(record, "model", "sentence_encoder")
            label = f"{strategy} {texts}" + (f" (by {by})" if by else "")
            cells = [label, num(row.get("items")), num(float(row["seconds"]), 2)]
            for kind in ("fp32", "int8"):
                ratio = get(record, "ratios", strategy, f"{stage.replace(' ', '_')}_vs_{kind}")
                cells += [num(get(bare, kind, texts, "seconds"), 2), num(ratio, 2)]
            encode.append(cells)
    shares = [
        [strategy, num(ratios.get("sentence_vectors_over_chunk_vectors"), 2)]
        for strategy, ratios in record.get("ratios", {}).items()
    ]
    return {
        "stages": (
            [
                f"stage ({corpus.get('corpus')}: {num(corpus.get('documents'))} documents, "
                f"{num((corpus.get('bytes') or 0) / 1e6, 1)} MB)",
                "chunk set",
                "items",
                "seconds",
                "rate",
                "MB/s",
                "peak RSS MB",
            ],
            stages,
        ),
        "encode": (
            ["texts", "count", "product s", "bare fp32 s", "product / fp32", "bare int8 s", "product / int8"],
            encode,
        ),
        "share": (["chunk set", "sentence vectors' seconds / chunk vectors'"], shares),
    }


def serving_memory(record: dict) -> dict[str, Table]:
    """bench/serving_memory.py: a serving replica's resident memory, the whole chunk table against records per hit."""
    data = record["data"]
    replicas = []
    for row in record["replicas"]:
        s = row["summary"]
        # Runs before the mapped-page budget existed record none of it: "—"; a row measured without one: "none".
        budget = "none" if "mapped_pages_mb" in row and row["mapped_pages_mb"] is None else row.get("mapped_pages_mb")
        cached = num(row.get("page_cache_mb"), 0) + (" (dropped)" if row.get("page_cache_dropped") else "")
        replicas.append(
            [
                row["label"],
                "table in memory" if row.get("holds_chunk_table") else "read per hit",
                num(s["steady_rss_mb"], 0),
                num(s["anon_mb"], 0),
                num(s["file_mb"], 0),
                num(s["peak_rss_mb"], 0),
                num(s["model_rss_mb"], 0),
                num(s["floor_rss_mb"], 0),
                num(row.get("passages_shared_with_before"), 3),
                ms(s["ask"]["p50_ms"]),
                ms(s["ask"]["p95_ms"]),
                budget if isinstance(budget, str) else num(budget, 0),
                num(row.get("mapped_page_trims")),
                cached,
            ]
        )
    builds = [
        [
            label,
            ", ".join(f"{k}: {v}" for k, v in build["layout"].items()) or "the engine's defaults",
            num(build["points"]),
            num(build["upsert_seconds"], 0),
            num(build["optimize_seconds"], 0),
            num(build["disk_mb"], 0),
        ]
        for label, build in record["builds"].items()
    ]
    sizing = []
    for row in record["replicas"]:
        s = row["summary"]
        heap, mapped = s["anon_bytes_per_chunk"], s["file_bytes_per_chunk"]
        disk = record["builds"].get(row["layout"], {}).get("disk_bytes_per_chunk")
        # A replica's heap at n chunks: this run's, plus what each chunk added from the floor's size to this one.
        at = [(s["anon_mb"] * 2**20 + heap * (n - data["chunks"])) / 2**30 for n in (10**7, 10**8)]
        sizing.append([row["label"], num(heap), num(mapped), num(disk), *(num(gb, 1) for gb in at)])
    ratios = [[figure.removesuffix("_new_over_before"), num(value, 3)] for figure, value in record["ratios"].items()]
    ratios.append(["same passages, same collection both ways", "yes" if record.get("same_passages") else "no"])
    # Which files the mapped pages are (runs before the breakdown was recorded have none).
    parts = list(dict.fromkeys(part for row in record["replicas"] for part in row.get("mapped_mb", {})))
    mapped = [[row["label"], *(num(row["mapped_mb"].get(p, 0.0), 0) for p in parts)] for row in record["replicas"]]
    tables = {"mapped": (["replica: mapped pages after the questions, MB", *parts], mapped)} if parts else {}
    return {
        "replicas": (
            [
                f"replica ({num(data['chunks'])} chunks, {num(data['mean_text_chars'], 0)} characters each)",
                "chunk records",
                "RSS MB",
                "heap (anon) MB",
                "mapped files MB",
                "peak MB",
                "after the model MB",
                f"RSS at {num(record['floor']['chunks'])} chunks MB",
                "passages shared with before",
                "ask p50 ms",
                "ask p95 ms",
                "mapped-page budget MB",
                "unmapped, times",
                "its collection in the page cache MB",
            ],
            replicas,
        ),
        **tables,
        "sizing": (
            [
                "replica",
                f"heap B / chunk (from {num(record['floor']['chunks'])} chunks to {num(data['chunks'])})",
                "mapped B / chunk",
                "disk B / chunk",
                "heap at 10M chunks GB (linear)",
                "heap at 100M chunks GB (linear)",
            ],
            sizing,
        ),
        "builds": (["collection layout", "settings", "points", "upsert s", "HNSW s", "disk MB"], builds),
        "ratios": (["new / before", "ratio"], ratios),
    }


def generic(record: dict) -> dict[str, Table]:
    """Scalar figures outside the provenance, by their path in the file (lists and per-query maps left out)."""
    rows: list[list[str]] = []

    def walk(value, path: list[str]) -> None:
        if len(rows) >= 60 or len(path) > 5:
            return
        if isinstance(value, dict):
            if len(value) > 50:  # a per-question or per-document map, not a summary figure
                return
            for key, inner in value.items():
                if not path and key in PROVENANCE_KEYS:
                    continue
                walk(inner, path + [str(key)])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            rows.append([" / ".join(path), num(value)])

    walk(record, [])
    return {"figures": (["figure", "value"], rows)}


# (file-name pattern, what the file answers, render function); the first match wins.
KINDS: list[tuple[str, str, Callable[[dict], dict[str, Table]]]] = [
    (
        "edge-latency*",
        "How fast is a search end to end on each engine and size, and how much of the exact top 10 "
        "does HNSW find? (`bench/edge_latency.py`)",
        edge_latency,
    ),
    (
        "hnsw-recall*",
        "Why does HNSW recall stall on copies of the same vectors, and which graph setting cures it? "
        "(`bench/hnsw_recall.py`)",
        hnsw_recall,
    ),
    (
        "training-scifact*",
        "Do the trained embedder and learned reranker beat their untrained start on SciFact's test "
        "queries? (`bench/training.py`)",
        training,
    ),
    (
        "canary-credit*",
        "Which signals tell a better ranking in a canary? The loop runs' interleaved queries counted under each credit "
        "rule, candidate wins:losses (log-likelihood ratio; 3.0 promotes) (`bench/canary_credit.py`)",
        canary_credit,
    ),
    (
        "gate-folds*",
        "Does the cross-fitted gate see what one held-out share of people's questions cannot? Finished loop runs' "
        "rankers gated again on their own share and over every share (`bench/gate_folds.py`)",
        gate_folds,
    ),
    (
        "canary-rule*",
        "How often and how soon does the canary's sequential rule promote, roll back on evidence of harm or reach its "
        "horizon, with and without the one-sided harm test, and with Wald's futility boundary? "
        "(`bench/canary_rule.py`)",
        canary_rule,
    ),
    (
        "recanary-*",
        "Does a finished run's canary, rerun with today's code on the same candidate and users, decide "
        "differently? (`bench/recanary.py`, retired: `bench/loop.py` answers it now; kept as history)",
        recanary,
    ),
    (
        "canary-*-paired",
        "Is the canary loop's end-to-end gain significant per test query? (`bench/canary_paired.py`, retired: "
        "`bench/loop.py` answers it now; kept as history)",
        canary_paired,
    ),
    (
        "canary-*",
        "Does feedback → retrain → gate → canary → promotion or rollback run with no manual step, and does "
        "what is served get better? (`bench/canary_loop.py`, retired: `bench/loop.py` answers it now; kept as history)",
        canary_loop,
    ),
    (
        "qa-chunking*",
        "Which chunking strategy finds SQuAD's answers within the prompt's character budget? "
        "(`bench/qa_eval.py --only chunking`)",
        qa_chunking,
    ),
    (
        "question-style*",
        "How do the rule-based synthetic questions compare with people's questions? (`bench/question_style.py`)",
        question_style,
    ),
    (
        "loop-*-candidates-on-test",
        "Would any model the loop trained have served people better, or worse? Each reranker and each canaried "
        "embedder scored on the run's test split, whatever its gate and canary said (`bench/loop_candidates.py`)",
        loop_candidates,
    ),
    (
        "loop-*-rerankers-on-test",
        "Would any reranker the loop trained have served people better? Each scored on the run's test split, "
        "whatever its gate and canary said (`bench/loop_candidates.py`)",
        loop_candidates,
    ),
    (
        "reranker-ceiling*",
        "How far can the loop's reranker learner go with perfect labels? Trained on every chunk that holds the answer "
        "instead of people's clicks, served as a canary arm, scored on the test split (`bench/reranker_ceiling.py`)",
        reranker_ceiling,
    ),
    (
        "loop-ablation",
        "What does each learner add, on each corpus? Every full `bench/loop.py` run side by side, with the ceilings "
        "it measured (`bench/loop_ablation.py`)",
        loop_ablation,
    ),
    (
        "loop-*",
        "Does the loop help people? People's questions, clicks, ratings and corrections through `rag serve`, the "
        "product's sensors and jobs, the served pipeline scored on held-out human questions (`bench/loop.py`)",
        loop,
    ),
    (
        "self-improvement*",
        "Does the product, from the documents alone, answer people's questions better after "
        "`retrain_job`? (`bench/self_improvement.py`, retired: `bench/loop.py` answers it now; kept as history)",
        self_improvement,
    ),
    (
        "gate-calibration*",
        "Does the promotion gate's verdict agree with each candidate's true effect on human "
        "questions? (`bench/gate_calibration.py`)",
        gate_calibration,
    ),
    (
        "replica-swap*",
        "How long does the serving replica's refresh take, and does serving pause meanwhile? (`bench/replica_swap.py`)",
        replica_swap,
    ),
    (
        "replica-open-pause*",
        "Which step of a replica refresh stops the request threads? (`bench/replica_open_pause.py`)",
        replica_open_pause,
    ),
    (
        "retrieval-*",
        "Retrieval quality per mode on SciFact, indexing throughput against plain `model.encode`, "
        "query latency and incremental re-indexing (`bench/retrieval.py`)",
        retrieval,
    ),
    (
        "answers-*",
        "How good and how fast is the extractive answer on SQuAD dev questions, against the human answers? "
        "(`bench/answers.py --only spans`)",
        answers,
    ),
    (
        "encoder-int8*",
        "Does encoding questions (and passages) with MiniLM's int8 ONNX twin keep retrieval quality on human "
        "questions, and how much faster is it? (`bench/encoder_int8.py`)",
        encoder_int8,
    ),
    (
        "indexing-*",
        "How long does a folder take from nothing to served, per stage (parse, chunk, BM25, chunk vectors, sentence "
        "vectors), and how close does the product encode to a bare encode of the same texts? (`bench/indexing.py`)",
        indexing,
    ),
    (
        "serving-memory*",
        "How much memory does a serving replica hold at 1M chunks, the whole chunk table in memory against records "
        "read per hit from the collection, and with which collection layout? (`bench/serving_memory.py`)",
        serving_memory,
    ),
    (
        "load-api*",
        "How fast does `rag serve` answer `/ask` with 1 and 10 clients, alone and while `rag index` re-indexes, and "
        "is every answered ask stored? (`bench/load_api.py`)",
        load_api,
    ),
    (
        "active-learning*",
        "How much do expert labels lift the retrained pipeline, per label budget and selection "
        "method? (`bench/active_learning.py`)",
        active_learning,
    ),
]


def kind_of(name: str) -> tuple[str, Callable[[dict], dict[str, Table]]]:
    for pattern, question, render in KINDS:
        if fnmatch.fnmatch(name, pattern):
            return question, render
    return "", generic


# --- provenance -------------------------------------------------------------------------------------------------------


def short_commit(commit: str | None) -> str:
    if not commit:
        return "not recorded"
    head, dirty, _ = commit.partition("-")
    return head[:7] + (" (uncommitted changes)" if dirty else "")


def command_of(record: dict) -> str:
    if record.get("argv"):
        return " ".join(str(a) for a in record["argv"])
    if isinstance(record.get("args"), dict):
        return json.dumps(record["args"], sort_keys=True, default=str)
    return "not recorded"


def machine_of(record: dict) -> str:
    machine = record.get("machine")
    if isinstance(machine, dict):
        parts = [
            f"{machine['cpus']} CPUs" if "cpus" in machine else None,
            f"{machine['memory_gb']} GB" if "memory_gb" in machine else None,
            f"Python {machine['python']}" if "python" in machine else None,
            f"load average at start {machine['loadavg'][0]:.1f}" if machine.get("loadavg") else None,
            f"nice {machine['nice']}" if machine.get("nice") else None,
        ]
        return ", ".join(p for p in parts if p)
    if "cpu_cores" in record:
        return f"{record['cpu_cores']} CPU cores"
    return "not recorded"


def provenance(name: str, record: dict) -> str:
    date = record.get("date") or "date not recorded"
    return f"`bench/results/{name}.json`, commit {short_commit(record.get('commit'))}, {date}"


def provenance_lines(record: dict) -> list[str]:
    lines = [
        f"- commit: {short_commit(record.get('commit'))}"
        + (f" (the loop it scores: {short_commit(record['loop_commit'])})" if record.get("loop_commit") else ""),
        f"- date: {record.get('date') or 'not recorded'}"
        + (f", finished {record['finished']}" if record.get("finished") else "")
        + (f" ({record['seconds']} s)" if isinstance(record.get("seconds"), (int, float)) else ""),
        f"- arguments: `{command_of(record)}`",
        f"- machine: {machine_of(record)}",
    ]
    return lines


# --- pages ------------------------------------------------------------------------------------------------------------


def load_results(results: Path) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(results.glob("*.json"))}


def views_of(record: dict, name: str) -> dict[str, Table]:
    _, render = kind_of(name)
    try:
        views = render(record)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        # A file named like a known kind but shaped otherwise (an older or newer script): its scalar figures still
        # render, and the section says which render function it did not fit.
        views = {f"generic ({render.__name__} did not fit this file)": generic(record)["figures"]}
    return {view: table for view, table in views.items() if table[1]}


def block(records: dict[str, dict], spec: str) -> str:
    optional = spec.endswith("?")
    name, _, view = spec.removesuffix("?").partition(":")
    if name not in records and optional:
        return f"Not measured yet: `bench/results/{name}.json` is absent.\n"
    if name not in records:
        raise SystemExit(f"figures:{spec}: no bench/results/{name}.json")
    views = views_of(records[name], name)
    if view and view not in views:
        raise SystemExit(f"figures:{spec}: {name} has the views {', '.join(views)}")
    chosen = [views[view]] if view else list(views.values())
    return "\n\n".join(markdown(t) for t in chosen) + f"\n\nSource: {provenance(name, records[name])}.\n"


def benchmarks_page(records: dict[str, dict]) -> str:
    out = [
        "# Benchmarks",
        "",
        "Rendered by `docs/render.py` (`make docs`) from `bench/results/*.json`; do not edit by hand. Every "
        "figure below is in the result file named above it, which its benchmark script wrote with the commit, "
        "date, arguments and machine of the run. The machines were 2 shared CPU cores unless the machine line "
        "says otherwise: compare ratios and figures measured in the same run, not absolute times across files.",
        "",
        "| result file | question |",
        "|---|---|",
    ]
    for name, record in records.items():
        question, _ = kind_of(name)
        out.append(
            f"| [`{name}`](#{name.replace('.', '')}) | {question or 'figures of ' + str(record.get('bench', name))} |"
        )
    for name, record in records.items():
        question, render = kind_of(name)
        views = views_of(record, name)
        out += ["", f"## {name}", ""]
        if question:
            out += [question, ""]
        else:
            out += ["No render function knows this kind of file yet: its scalar figures as they are.", ""]
        out += provenance_lines(record) + [""]
        for view, table in views.items():
            out += [f"*{view}* (`<!-- figures:{name}:{view} -->`)", "", markdown(table), ""]
        if not views:
            out += ["No figures in this file.", ""]
    return "\n".join(out).rstrip() + "\n"


def fill_blocks(text: str, records: dict[str, dict]) -> str:
    return BLOCK.sub(lambda m: m.group(1) + block(records, m.group("name")) + m.group(4), text)


def render(root: Path = ROOT) -> dict[Path, str]:
    """Every page this script owns or fills, by path, as a fresh render would write it."""
    records = load_results(root / "bench" / "results")
    docs = root / "docs"
    pages = {docs / BENCHMARKS: benchmarks_page(records)}
    for page in sorted(docs.glob("*.md")) + [root / p for p in EXTRA_PAGES]:
        if page.name != BENCHMARKS and page.exists():
            pages[page] = fill_blocks(page.read_text(), records)
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in render().items():
        if not path.exists() or path.read_text() != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(text)
    verb = "out of date" if args.check else "rewritten"
    print("\n".join(f"{verb}: {p}" for p in stale) or "docs are up to date")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
