"""`/ask` under load, through a real `rag serve` (uvicorn, as users run it, default answer settings: extractive
answers) over a corpus indexed by `rag index` (the product's own index path, so whatever the index step computes is
included). Closed-loop clients (1 and 10 by default) ask for a fixed time each, first alone, then while `rag index`
re-indexes the same folder again and again in another process (each round edits a few documents, so every round
parses, chunks, re-embeds and rebuilds BM25 for real); a re-index phase goes on until its last run has finished and
the API has swapped to the index it built, so the clients meet every part of a re-index, the swap included.

Per phase: p50/p95/p99/mean/max of the client-side `/ask` latency, answered requests/s, errors, the index generation
the API served before and after, the re-index runs, and the median of each pipeline stage when the /ask response
carries per-stage timings (read from the response at run time; absent keys are skipped). Afterwards the feedback
store must hold one query per answered ask (nothing lost under load) and pass its integrity check.

    .venv/bin/python bench/load_api.py                # SciFact (5,183 abstracts) -> bench/results/load-api.json
    .venv/bin/python bench/load_api.py --data-dir /tmp/loadbench-scifact   # keeps the index: the next run reuses it
    .venv/bin/python bench/load_api.py --quick        # bundled sample_corpus, short phases -> load-api-quick.json

The data dir is reused when given: its docs/ folder is brought back to the pristine corpus and `rag index` runs
incrementally (a few seconds when nothing changed; the first time it is the full build, timed in the result).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.lib.cli import add_output, add_quick, add_scifact, parser
from bench.lib.datasets import REPO, RESULTS, SCIFACT, scifact_absent
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import log, write

TOKEN = "load-test-token-0123456789"
SAMPLE_CORPUS = REPO / "sample_corpus"
# Questions the bundled sample corpus can answer (its tables, its book page and handbook), for the quick run.
SAMPLE_QUESTIONS = [
    "What is the labor rate per hour?",
    "What is the total cost per product?",
    "What was the total number of NICS firearm background checks in November 2015?",
    "How many permit checks were there in total in November 2015?",
    "Who is Anna Pavlovna Scherer?",
    "What did the Senate spend on expenditures?",
    "What did the Federal Register notice announce?",
    "What was argued before the Supreme Court?",
]
CHURN_DOCS = 20  # documents each re-index round edits
TARGETS = {"ask_p95_ms_at_1_client": 50.0, "requests_per_s_at_10_clients": 40.0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proc_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def latency_summary(ms: list[float]) -> dict:
    """Percentiles of client-side latencies in milliseconds (empty when nothing was answered)."""
    if not ms:
        return {"n": 0}
    a = np.asarray(ms, dtype=float)
    return {
        "n": len(ms),
        **{f"p{q}_ms": round(float(np.percentile(a, q)), 1) for q in (50, 95, 99)},
        "mean_ms": round(float(a.mean()), 1),
        "max_ms": round(float(a.max()), 1),
    }


def stage_timings(response: dict) -> dict[str, float] | None:
    """The per-stage milliseconds an /ask response carries, whatever the field is called (`timings`, `timings_ms`,
    ...): the first dict-valued key naming timings whose values are numbers. None when the response has none."""
    for key, value in response.items():
        if "timing" in key.lower() and isinstance(value, dict):
            stages = {
                str(k): float(v) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            if stages:
                return stages
    return None


def stage_medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """Median of each stage over the responses that timed it, slowest first."""
    names = {name for sample in samples for name in sample}
    medians = {name: round(float(np.median([s[name] for s in samples if name in s])), 2) for name in names}
    return dict(sorted(medians.items(), key=lambda kv: -kv[1]))


async def ask_loop(
    http,
    questions: list[str],
    deadline: float,
    busy: Callable[[], bool],
    rng: random.Random,
    out: dict,
    asked: set[str],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """One closed-loop client: ask, wait for the answer, ask again, until `deadline` (on `clock`) has passed and
    `busy()` is false. `asked`: the questions this server was asked before (shared by all clients and phases): a
    question asked again finds its vector in the server's cache, so its latency is also reported apart."""
    import httpx

    while clock() < deadline or busy():
        question = rng.choice(questions)
        new = question not in asked
        asked.add(question)
        started = time.perf_counter()
        try:
            r = await http.post("/ask", json={"question": question, "session_id": f"load-{rng.random()}"})
        except httpx.HTTPError as exc:
            out["errors"].append(f"ask: {type(exc).__name__}: {exc}"[:160])
            continue
        elapsed_ms = (time.perf_counter() - started) * 1000
        if r.status_code != 200:
            out["errors"].append(f"ask {r.status_code}: {r.text[:120]}")
            continue
        data = r.json()
        out["ms"].append(elapsed_ms)
        out["new_ms" if new else "repeat_ms"].append(elapsed_ms)
        out["server_ms"].append(float(data.get("latency_ms") or 0))
        out["keys"].update(data)
        if (stages := stage_timings(data)) is not None:
            out["stages"].append(stages)


def measure(
    base: str,
    questions: list[str],
    clients: int,
    seconds: float,
    seed: int = 0,
    busy: Callable[[], bool] = lambda: False,
    asked: set[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """`clients` closed-loop clients asking for `seconds`, and on while `busy()` (a re-index still running):
    latency percentiles, answered requests/s, errors and stage medians. The clock starts once every client's
    connection pool exists; the rate counts answered asks over the whole window (until the last answer in flight at
    the end); errors are reported, not counted. `clock`: what `seconds` are read on (tests step it per read)."""
    import httpx

    out = {"ms": [], "new_ms": [], "repeat_ms": [], "server_ms": [], "errors": [], "stages": [], "keys": set()}
    asked = set() if asked is None else asked
    window = {}

    async def load() -> None:
        rng = random.Random(seed)
        pools = [
            httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300)
            for _ in range(clients)
        ]
        try:
            window["start"] = time.perf_counter()
            deadline = clock() + seconds
            await asyncio.gather(
                *(
                    ask_loop(http, questions, deadline, busy, random.Random(rng.random()), out, asked, clock)
                    for http in pools
                )
            )
            window["end"] = time.perf_counter()
        finally:
            await asyncio.gather(*(http.aclose() for http in pools))

    asyncio.run(load())
    elapsed = window["end"] - window["start"]
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "answered": len(out["ms"]),
        "requests_per_s": round(len(out["ms"]) / elapsed, 2),
        "ask": latency_summary(out["ms"]),
        # first asks of a question in this server vs asked before (its vector cached, unless a swap emptied it)
        "ask_new_questions": latency_summary(out["new_ms"]),
        "ask_repeated_questions": latency_summary(out["repeat_ms"]),
        "server_latency_ms_p50": round(float(np.median(out["server_ms"])), 1) if out["server_ms"] else None,
        "errors": len(out["errors"]),
        "error_samples": sorted(set(out["errors"]))[:5],
        "stage_medians_ms": stage_medians(out["stages"]) if out["stages"] else None,
        "response_keys": sorted(out["keys"]),
    }


class Corpus:
    """The documents to index (written into <data dir>/docs) and the questions to ask."""

    def __init__(self, name: str, scifact: Path):
        self.name = name
        if name == "scifact":
            with open(scifact / "corpus.jsonl") as fh:
                docs = [json.loads(line) for line in fh]
            with open(scifact / "queries.jsonl") as fh:
                self.questions = [json.loads(line)["text"] for line in fh]
            self.files = {f"{d['_id']}.md": f"# {d['title']}\n\n{d['text']}\n".encode() for d in docs}
        else:
            self.questions = SAMPLE_QUESTIONS
            self.files = {
                str(p.relative_to(SAMPLE_CORPUS)): p.read_bytes()
                for p in sorted(SAMPLE_CORPUS.rglob("*"))
                if p.is_file() and p.name != "LICENSES.md"
            }
        # Only text files are edited by the re-index rounds (appending a line to a PDF would break it).
        self.churnable = [name for name in self.files if name.endswith((".md", ".txt"))][:CHURN_DOCS]

    def write_pristine(self, docs: Path) -> int:
        """Make `docs` hold exactly the corpus; returns how many files had to be (re)written or removed."""
        changed = 0
        for name, content in self.files.items():
            path = docs / name
            if not path.exists() or path.read_bytes() != content:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
                changed += 1
        for path in [p for p in docs.rglob("*") if p.is_file()]:
            if str(path.relative_to(docs)) not in self.files:
                path.unlink()
                changed += 1
        return changed

    def edit(self, docs: Path, revision: int) -> None:
        """A re-index round's change: each churned document gains a line naming the round."""
        for name in self.churnable:
            (docs / name).write_bytes(self.files[name] + f"\nRevision {revision} of this document.\n".encode())


def rag(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args], cwd=REPO, env=env, capture_output=True, text=True
    )


def index(docs: Path, strategy: str, env: dict) -> dict:
    """`rag index` (incremental: unchanged files are skipped), timed; what it parsed and embedded."""
    started = time.perf_counter()
    proc = rag("index", str(docs), "--strategy", strategy, "--model", "minilm", "--json", env=env)
    seconds = round(time.perf_counter() - started, 1)
    if proc.returncode:
        return {"seconds": seconds, "ok": False, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    try:
        report = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        report = {}
    parse = report.get("parse", {})
    counts = {k: parse.get(k) for k in ("documents", "parsed", "unchanged", "removed")}
    return {
        "seconds": seconds,
        "ok": True,
        **counts,
        "collections": {
            name: {k: c.get(k) for k in ("points", "added", "updated", "deleted", "seconds")}
            for name, c in report.get("collections", {}).items()
        },
    }


def reindex_loop(
    corpus: Corpus,
    docs: Path,
    strategy: str,
    env: dict,
    deadline: float,
    runs: list[dict],
    first_revision: int,
    base: str,
    swap_wait: float,
) -> None:
    """Edit the churned documents and re-index, back to back, starting runs until `deadline` (time.monotonic); then
    wait until the API serves the last index built, so the clients also meet the swap to it."""
    before = generation(base)
    revision = first_revision
    while time.monotonic() < deadline:
        corpus.edit(docs, revision)
        runs.append({"revision": revision, **index(docs, strategy, env)})
        revision += 1
    if any(run["ok"] for run in runs):
        wait_for_generation(base, before, swap_wait)


def generation(base: str) -> int | None:
    import httpx

    return httpx.get(f"{base}/health", timeout=30).json().get("index", {}).get("generation")


def wait_for_generation(base: str, above: int | None, seconds: float) -> int | None:
    """Wait (up to `seconds`) until the API serves a generation above `above`; the generation it serves then."""
    deadline = time.monotonic() + seconds
    current = generation(base)
    while above is not None and (current or 0) <= above and time.monotonic() < deadline:
        time.sleep(1)
        current = generation(base)
    return current


def start_server(env: dict) -> tuple[subprocess.Popen, str, float]:
    import httpx

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_file = tempfile.TemporaryFile(mode="w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "orchestration.cli", "serve", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = time.monotonic()
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return server, base, round(time.monotonic() - started, 1)
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() - started > 300:
            server.kill()
            log_file.seek(0)
            raise RuntimeError(f"rag serve did not start: {log_file.read()[-1500:]}")
        time.sleep(0.5)


def stop_server(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()


def run(
    *,
    quick: bool = False,
    corpus: str | None = None,
    clients: list[int] | None = None,
    seconds: float | None = None,
    data_dir: Path | None = None,
    refresh_seconds: float = 5.0,
    scifact: Path = SCIFACT,
    seed: int = 0,
    reindex: bool = True,
    warmup: int = 20,
    ask_concurrency: int | None = None,
) -> dict:
    """The measurement; returns the result (without provenance). `quick`: the sample corpus and 10 s phases."""
    corpus = corpus or ("sample" if quick else "scifact")
    if corpus == "scifact" and scifact_absent(scifact):
        return {"skipped": f"no SciFact at {scifact}"}
    clients = clients or [1, 10]
    seconds = seconds or (10.0 if quick else 60.0)
    from rag.feedback import FeedbackStore
    from rag.qa import AnswerSettings

    strategy = AnswerSettings().strategy  # what `rag serve` answers from by default
    chosen = Corpus(corpus, scifact)
    with tempfile.TemporaryDirectory(prefix="load-api-") as scratch:
        root = Path(data_dir) if data_dir else Path(scratch) / "data"
        docs = root / "docs"
        docs.mkdir(parents=True, exist_ok=True)
        store_file = root / "feedback.sqlite"
        store_file.unlink(missing_ok=True)  # the store check counts this run's queries only
        env = {
            **os.environ,
            "RAG_DATA_DIR": str(root),
            "RAG_API_TOKEN": TOKEN,
            "RAG_SERVE_REFRESH_SECONDS": str(refresh_seconds),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "DAGSTER_HOME": str(root / "dagster"),
        }
        for name in ("QDRANT_URL", "RAG_QDRANT_PATH", "RAG_ANSWER_CONFIG", "RAG_FEEDBACK_DB", "RAG_ASK_CONCURRENCY"):
            env.pop(name, None)
        if ask_concurrency is not None:
            env["RAG_ASK_CONCURRENCY"] = str(ask_concurrency)
        rewritten = chosen.write_pristine(docs)
        log(f"{corpus}: {len(chosen.files)} documents in {docs} ({rewritten} written); rag index ...")
        built = index(docs, strategy, env)
        if not built["ok"]:
            raise RuntimeError(f"rag index failed: {built['error']}")
        log(f"indexed in {built['seconds']} s ({built.get('parsed')} parsed, {built.get('unchanged')} unchanged)")

        server, base, startup_s = start_server(env)
        phases, revision = [], 1
        try:
            import httpx

            asked = set(chosen.questions[:warmup])
            for question in chosen.questions[:warmup]:  # first asks load caches: not the steady state
                httpx.post(
                    f"{base}/ask",
                    json={"question": question},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=300,
                ).raise_for_status()
            idle_rss_mb = round(proc_kib(server.pid, "VmRSS") / 1024, 1)
            served = httpx.get(f"{base}/health", timeout=30).json().get("served")
            for with_reindex in [False, True] if reindex else [False]:
                for n in clients:
                    before, runs = generation(base), []
                    worker = threading.Thread(
                        target=reindex_loop,
                        args=(
                            chosen,
                            docs,
                            strategy,
                            env,
                            time.monotonic() + seconds,
                            runs,
                            revision,
                            base,
                            4 * refresh_seconds + 60,
                        ),
                    )
                    if with_reindex:
                        worker.start()
                    log(f"{n} client(s), {seconds:.0f} s{', re-indexing' if with_reindex else ''} ...")
                    # With a re-index the clients ask on until its last run has finished and the API serves it.
                    phase = measure(base, chosen.questions, n, seconds, seed, busy=worker.is_alive, asked=asked)
                    if with_reindex:
                        worker.join()
                        revision += len(runs)
                    after = generation(base)
                    phase = {
                        "reindex": with_reindex,
                        **phase,
                        "index_generation": [before, after],
                        "reindex_runs": runs,
                    }
                    phases.append(phase)
                    ask = phase["ask"]
                    log(
                        f"  {phase['requests_per_s']} req/s, p50 {ask.get('p50_ms')} ms, p95 {ask.get('p95_ms')} ms, "
                        f"p99 {ask.get('p99_ms')} ms, errors {phase['errors']}"
                        + (f", re-index runs {[r['seconds'] for r in runs]}" if with_reindex else "")
                    )
            peak_rss_mb = round(proc_kib(server.pid, "VmHWM") / 1024, 1)
        finally:
            stop_server(server)
            if reindex:  # a reused data dir keeps the pristine corpus's index, not the last edit's
                chosen.write_pristine(docs)
                restored = index(docs, strategy, env)
                log(f"restored the pristine corpus's index in {restored['seconds']} s")
        store = FeedbackStore(f"sqlite:///{store_file}")
        try:
            queries, problems = store.counts()["queries"], store.integrity_problems()
        finally:
            store.close()
    answered = sum(p["answered"] for p in phases) + min(warmup, len(chosen.questions))
    return {
        "corpus": {
            "name": corpus,
            "documents": len(chosen.files),
            "questions": len(chosen.questions),
            "churned_per_reindex": len(chosen.churnable),
        },
        "serving": {
            "command": "rag serve --port <free port> (default answer settings)",
            "strategy": strategy,
            "served": served,
            "ask_concurrency": ask_concurrency or "default",
            "refresh_seconds": refresh_seconds,
            "startup_s": startup_s,
            "idle_rss_mb": idle_rss_mb,
            "peak_rss_mb": peak_rss_mb,
        },
        "index_build": built,
        "data_dir": str(root) if data_dir else None,
        "phases": phases,
        "store_check": {
            "queries_stored": queries,
            "asks_answered": answered,
            "lost": answered - queries,
            "integrity_problems": problems,
        },
        "targets": TARGETS,
        "meets_targets": meets_targets(phases),
    }


def meets_targets(phases: list[dict]) -> dict:
    """The issue's figures, checked on the phases without a re-index (None when that phase was not run)."""
    quiet = {p["clients"]: p for p in phases if not p["reindex"]}
    one, ten = quiet.get(1), quiet.get(10)
    return {
        "ask_p95_ms_at_1_client": None if one is None else one["ask"].get("p95_ms", float("inf")) <= 50.0,
        "requests_per_s_at_10_clients": None if ten is None else ten["requests_per_s"] >= 40.0,
    }


def main() -> int:
    p = parser(__doc__)
    add_quick(p, "the bundled sample_corpus and 10 s phases (writes load-api-quick.json)")
    add_scifact(p)
    p.add_argument("--corpus", choices=["scifact", "sample"], help="default: scifact (sample with --quick)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 10], help="concurrent clients, one phase each")
    p.add_argument("--seconds", type=float, help="length of each phase (default 60, 10 with --quick)")
    p.add_argument("--data-dir", type=Path, help="keep (and reuse) the index here instead of a temporary folder")
    p.add_argument(
        "--refresh-seconds",
        type=float,
        default=5.0,
        help="how often the API looks for a re-built index (RAG_SERVE_REFRESH_SECONDS)",
    )
    p.add_argument("--no-reindex", action="store_true", help="only the phases without a concurrent re-index")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=20, help="asks before the first phase, not measured (default 20)")
    p.add_argument("--ask-concurrency", type=int, help="answers the API computes at once (default: rag serve's)")
    add_output(p, flags=("--json",))
    args = p.parse_args()
    record = run_record(args)
    result = run(
        quick=args.quick,
        corpus=args.corpus,
        clients=args.clients,
        seconds=args.seconds,
        data_dir=args.data_dir,
        refresh_seconds=args.refresh_seconds,
        scifact=args.scifact,
        seed=args.seed,
        reindex=not args.no_reindex,
        warmup=args.warmup,
        ask_concurrency=args.ask_concurrency,
    )
    out = args.json or RESULTS / ("load-api-quick.json" if args.quick else "load-api.json")
    write(stamp_end({**record, **result}), out)
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
