"""Every benchmark that applies, one command: `make bench` (or `make bench-quick`).

Writes bench/results/<timestamp>.json and <timestamp>.md (with PNG plots beside it) and prints a one-screen
summary. Each figure is measured beside its baseline in the same run; nothing here asserts.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from bench import fuzz_parsers, load_api, parse_throughput, qa_eval, retrieval  # load_api: the feedback loop's API load
from bench.lib import cli
from bench.lib.datasets import REPO, RESULTS
from bench.lib.results import write


def _plot_latency(latency: dict, path: Path) -> Path | None:
    if not latency:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(latency, key=lambda s: int(s.rstrip("k")))
    xs = [int(s.rstrip("k")) * 1000 for s in sizes]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, mode in enumerate(latency[sizes[0]]):
        color = f"C{i}"  # one colour per mode: solid p50, dashed p95
        ax.plot(xs, [latency[s][mode]["p50_ms"] for s in sizes], marker="o", color=color, label=f"{mode} p50")
        ax.plot(
            xs,
            [latency[s][mode]["p95_ms"] for s in sizes],
            marker="x",
            color=color,
            linestyle="--",
            alpha=0.6,
            label=f"{mode} p95",
        )
    ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlabel("points in the collection"), ax.set_ylabel("ms per query")
    (
        ax.set_title("query latency vs collection size (embedded Qdrant, 2 cores)"),
        ax.grid(alpha=0.3),
        ax.legend(fontsize=6, ncol=2),
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def indexing_memory(model: str = "minilm") -> dict:
    """Peak RSS of a whole `rag index` run (parse → chunk → BM25 → embed) on the bundled sample corpus."""
    import os
    import resource
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "orchestration.cli", "index", str(REPO / "sample_corpus"), "--model", model],
            cwd=REPO,
            env={**os.environ, "RAG_DATA_DIR": tmp},
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux reports KiB
    result = {"peak_rss_mb": round(peak_mb, 1), "seconds": round(seconds, 1), "ok": proc.returncode == 0}
    print(f"  rag index sample_corpus (all strategies, {model}): peak RSS {peak_mb:.0f} MB in {seconds:.0f}s")
    return result


def trained_models() -> dict:
    """SciFact figures of trained models from every bench/training.py result file (bench/results/training-scifact*.json,
    each written by the script with its date and commit): training takes tens of minutes on 2 cores, so this suite
    reports them instead of retraining."""
    out = {}
    for path in sorted(RESULTS.glob("training-scifact*.json")):
        r = json.loads(path.read_text())
        if "stages" not in r:
            continue
        label = (
            f"{path.name}: {r.get('date', 'date not recorded')[:10]}, commit {str(r.get('commit', '?'))[:12]}, "
            f"{r.get('corpus_documents')} documents"
        )
        for stage, s in r["stages"].items():
            t = s["test"]
            out[f"[{label}] {stage} {s['model']}"] = (
                f"{t['base_ndcg@10']:.4f} -> {t['ndcg@10']:.4f} (p={t['p_value_ndcg@10']:.4f})"
            )
    return out


def canary_rollouts() -> dict:
    """The gradual-rollout loop on SciFact from each result file of the retired bench/canary_loop.py
    (bench/results/canary-scifact*.json, kept as history with its args, date and commit; bench/loop.py answers its
    question now): reported, not rerun."""

    def needed(phase: dict) -> str:
        if not phase.get("decision"):
            return "no canary decision"
        by = f" by a guardrail ({phase['breaches']})" if phase.get("breaches") else " by the sequential test"
        return (
            f"{phase['decision']}{by} after {phase['canary_queries']} canary queries "
            f"({phase['decisive_canary_queries']} "
            "decisive)"
        )

    out = {}
    for path in sorted(RESULTS.glob("canary-scifact*.json")):
        r = json.loads(path.read_text())
        first, worse = r["phases"].get("retrain_canary", {}), r["phases"].get("worse_candidate", {})
        gate = first.get("gates", {}).get("finetuned_embedder_gate", {}).get("passed")
        started = first.get("canary_started_by") or "no canary"
        label = (
            f"{path.name}: {r['date'][:10]}, commit {str(r['commit'])[:12]}, canary share "
            f"{r['canary']['traffic_share']:.0%}, "
            f"p_negative {r['click_model']['p_negative']}"
        )
        served = ""
        if "served_ndcg@10_start" in r:  # runs since the bench serves the production reranker too
            queued = "; ".join(
                f"{p.get('kind')} {p.get('candidate_version')}: {needed(p)}" for p in first.get("queued_canaries", [])
            )
            served = (
                f"served (embedder + production reranker {first.get('reranker_production_after')}) test nDCG@10 "
                f"{r['served_ndcg@10_start']:.4f} -> {first.get('served_ndcg@10_after', float('nan')):.4f}"
                f"{f' (queued canaries: {queued})' if queued else ''}; "
            )
        out[label] = (
            f"{served}dense test nDCG@10 {r['ndcg@10_start']:.4f} -> {first.get('ndcg@10_after', float('nan')):.4f}; "
            "retrained "
            f"{first.get('candidate')} (test nDCG@10 {first.get('candidate_ndcg@10', float('nan')):.4f}, gate "
            f"{'passed' if gate else 'rejected'}; {started}): {needed(first)}; deliberately worse "
            f"{worse.get('candidate')} (test nDCG@10 {worse.get('candidate_ndcg@10', float('nan')):.4f}): "
            f"{needed(worse)}"
        )
    return out


def summary_lines(r: dict) -> list[str]:
    lines = []
    if "memory" in r:
        lines.append(
            f"memory: indexing peak RSS {r['memory']['peak_rss_mb']:.0f} MB (rag index of the sample corpus, all "
            "strategies)"
        )
    parse = r.get("parse", {})
    if parse:
        lines.append(
            f"parse: {parse['ours_pages_per_s']:.1f} pages/s vs raw pdfplumber {parse['raw_pages_per_s']:.1f} (ratio "
            f"{parse['ratio']:.2f})"
        )
    ret = r.get("retrieval", {})
    if "quality" in ret:
        nd = ret["quality"]["ndcg@10"]
        q = ret["quality"]
        where = (
            f"quick slice of {q['documents']} abstracts, α=0.5: not comparable with the anchors"
            if q.get("slice")
            else f"α={q['alpha']} from train; anchors bm25 0.665, minilm 0.645"
        )
        lines.append("SciFact nDCG@10: " + ", ".join(f"{m} {v:.4f}" for m, v in nd.items()) + f" ({where})")
    if "throughput" in ret:
        t = ret["throughput"]
        lines.append(
            f"indexing: {t['pipeline_per_s']:.1f} chunks/s vs model.encode {t['encode_per_s']:.1f} (ratio "
            f"{t['ratio']:.2f}, goal ≥ 0.9)"
        )
    for size, modes in ret.get("latency", {}).items():
        lines.append(
            f"latency {size}: "
            + ", ".join(f"{m} p50 {v['p50_ms']:.0f}/p95 {v['p95_ms']:.0f} ms" for m, v in modes.items())
        )
    if "incremental" in ret:
        inc = ret["incremental"]
        lines.append(
            f"incremental: 1% changed {inc['1%']['ratio']:.3f} of a full build (goal ≤ 0.05), 10% "
            f"{inc['10%']['ratio']:.3f}"
        )
    qa = r.get("qa", {})
    if "squad_corpus" in qa:
        lines.append(
            "SQuAD corpus nDCG@10: " + ", ".join(f"{m} {v['ndcg@10']:.3f}" for m, v in qa["squad_corpus"].items())
        )
    if "chunking" in qa:
        best = max(qa["chunking"], key=lambda row: row["retrieval_score hybrid-rrf"])
        lines.append(
            f"SQuAD chunking (hybrid-rrf, {best['questions']} questions for every strategy, passages within a "
            f"{best['max_context_chars']}-char prompt): best RetrievalScore {best['strategy']} "
            f"{best['retrieval_score hybrid-rrf']:.3f} "
            f"(recall@5 {best['recall@5 hybrid-rrf']:.3f}, {best['context_chars@5 hybrid-rrf']:.0f} context chars) "
            "over "
            f"{len(qa['chunking'])} strategies"
        )
    for label, s in qa.get("synthetic", {}).items():
        if isinstance(s, dict):
            rate = (
                f"{s['per_100_chunks']} per 100 chunks"
                if s.get("per_100_chunks") is not None
                else f"quick: {s.get('documents')} documents"
            )
            lines.append(f"synthetic QA ({label}): {s['questions']} of {s['attempted']} kept, {rate}")
    serving = r.get("serving", {})
    for phase in serving.get("phases", []):  # `rag serve` under load, alone and while `rag index` re-indexes
        lines.append(
            f"API: {phase['clients']} clients{' while re-indexing' if phase['reindex'] else ''}: "
            f"{phase['requests_per_s']} req/s, /ask p50/p95 {phase['ask'].get('p50_ms')}/{phase['ask'].get('p95_ms')} "
            f"ms, errors {phase['errors']}"
        )
    if "store_check" in serving:
        check = serving["store_check"]
        lines.append(
            f"API store: {check['queries_stored']} of {check['asks_answered']} answered asks stored, "
            f"{check['lost']} lost"
        )
    fuzz = r.get("fuzz", {})
    if "cases" in fuzz:
        lines.append(
            f"fuzz: {fuzz['cases']} mutated shared files, {len(fuzz['findings'])} findings, outcomes "
            + ", ".join(f"{k} {v}" for k, v in sorted(fuzz["outcomes"].items(), key=lambda kv: -kv[1]))
        )
    trained = r.get("trained_models", {})
    if trained:
        lines.append(
            "trained models, SciFact test nDCG@10 (bench/training.py, paired test vs the untrained start): "
            + "; ".join(f"{k} {v}" for k, v in trained.items())
        )
    for label, line in r.get("canary_rollout", {}).items():
        lines.append(f"gradual rollout, simulated users on SciFact (retired bench/canary_loop.py) [{label}]: {line}")
    return lines


def main() -> int:
    parser = cli.parser(__doc__)
    cli.add_quick(parser, "minutes, not the full figures")
    parser.add_argument("--skip", default="", help="comma-separated: memory, parse, retrieval, qa, serving, fuzz")
    parser.add_argument("--llm", default="local-gguf", help="LLM backend for synthetic questions (none to skip it)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    started = time.perf_counter()
    results: dict = {"started": stamp, "quick": args.quick}
    if "memory" not in skip:
        print("== memory")
        results["memory"] = indexing_memory()
    if "parse" not in skip:
        print("== parsing and chunking")
        results["parse"] = parse_throughput.run(repeat=1 if args.quick else 3)
    if "retrieval" not in skip:
        print("== retrieval")
        results["retrieval"] = retrieval.run(quick=args.quick)
    if "qa" not in skip:
        print("== QA sets and evaluation")
        results["qa"] = qa_eval.run(quick=args.quick, llm=args.llm)
    if "serving" not in skip:
        print("== serving (rag serve under load while re-indexing)")
        results["serving"] = load_api.run(quick=args.quick)
    if "fuzz" not in skip:
        print("== fuzzing the parsers (mutated shared files, one child process each)")
        results["fuzz"] = fuzz_parsers.run(cases=30 if args.quick else 300)
    trained = trained_models()
    if trained:
        results["trained_models"] = trained
    canary = canary_rollouts()
    if canary:
        results["canary_rollout"] = canary
    results["seconds"] = time.perf_counter() - started

    json_path = RESULTS / f"{stamp}.json"
    write(results, json_path, indent=2, default=float)
    plot = _plot_latency(results.get("retrieval", {}).get("latency", {}), RESULTS / f"{stamp}-latency.png")
    lines = summary_lines(results)
    md = [f"# Benchmarks {stamp}{' (quick)' if args.quick else ''}", "", *[f"- {line}" for line in lines]]
    if plot:
        md += ["", f"![latency]({plot.name})"]
    md_path = RESULTS / f"{stamp}.md"
    md_path.write_text("\n".join(md) + "\n")
    print("\n" + "=" * 78)
    print(*lines, sep="\n")
    print(f"results: {json_path}\nreport:  {md_path}" + (f"\nplot:    {plot}" if plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
