"""Load on `rag serve` (loopback only, bounded): N concurrent clients ask SciFact questions and rate passages for
S seconds while `rag index` re-indexes the same data dir in another process (embedded Qdrant: the API answers
from its serving replica). Prints requests/s, p50/p95 latency per endpoint, errors, the API's peak RSS, whether
the API picked up the new index, and checks that every acknowledged feedback row is in the store.

    .venv/bin/python bench/load_api.py [--clients 50] [--seconds 60] [--docs 300]
"""
from __future__ import annotations

import argparse
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
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SCIFACT = REPO.parent / "shared" / "datasets" / "scifact"
TOKEN = "load-test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _write_docs(folder: Path, docs: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for d in docs:
        (folder / f"{d['_id']}.md").write_text(f"# {d['title']}\n\n{d['text']}\n")


def _scifact(n_docs: int) -> tuple[list[dict], list[str]]:
    with open(SCIFACT / "corpus.jsonl") as fh:
        docs = [json.loads(line) for _, line in zip(range(n_docs), fh)]
    with open(SCIFACT / "queries.jsonl") as fh:
        questions = [json.loads(line)["text"] for line in fh]
    return docs, questions


def _rag(*args: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, **kw)


async def _client(base: str, questions: list[str], deadline: float, rng: random.Random, out: dict) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as http:
        n = 0
        while time.monotonic() < deadline:
            n += 1
            started = time.perf_counter()
            try:
                r = await http.post("/ask", json={"question": rng.choice(questions), "session_id": f"load-{id(out)}-{rng.random()}"})
            except httpx.HTTPError as exc:
                out["errors"].append(f"ask: {type(exc).__name__}")
                continue
            out["latency"]["ask"].append(time.perf_counter() - started)
            if r.status_code != 200:
                out["errors"].append(f"ask {r.status_code}: {r.text[:120]}")
                continue
            data = r.json()
            ratings = [{"chunk_id": p["chunk_id"], "score": 1 if i == 0 else -1} for i, p in enumerate(data["passages"][:3])]
            body = {"query_id": data["query_id"], "idempotency_key": f"{data['query_id']}-{n}", "answer_score": rng.choice([1, -1]),
                    "passages": ratings}
            started = time.perf_counter()
            try:
                f = await http.post("/feedback", json=body)
            except httpx.HTTPError as exc:
                out["errors"].append(f"feedback: {type(exc).__name__}")
                continue
            out["latency"]["feedback"].append(time.perf_counter() - started)
            if f.status_code == 201:
                out["acked"].extend(f.json()["event_ids"])
            else:
                out["errors"].append(f"feedback {f.status_code}: {f.text[:120]}")


def _reindex_loop(docs_dir: Path, extra: list[dict], env: dict, stop: threading.Event, runs: list[dict]) -> None:
    """Add documents and re-index, again and again, until the load ends."""
    batch = max(1, len(extra) // 4)
    for i in range(0, len(extra), batch):
        if stop.wait(3):
            return
        _write_docs(docs_dir, extra[i:i + batch])
        started = time.perf_counter()
        proc = _rag("index", str(docs_dir), "--strategy", "paragraph", "--model", "minilm", env=env)
        runs.append({"seconds": round(time.perf_counter() - started, 1), "ok": proc.returncode == 0,
                     "error": proc.stderr.strip().splitlines()[-1] if proc.returncode else None, "docs_added": len(extra[i:i + batch])})


def run(*, clients: int = 50, seconds: float = 60, n_docs: int = 300, quick: bool = False) -> dict:
    if not SCIFACT.is_dir():
        print(f"  skipped: {SCIFACT} not available")
        return {"skipped": "no SciFact"}
    if quick:
        clients, seconds, n_docs = min(clients, 10), min(seconds, 15), min(n_docs, 100)
    from rag.feedback import FeedbackStore

    docs, questions = _scifact(n_docs + n_docs // 5)
    base_docs, extra = docs[:n_docs], docs[n_docs:]
    with tempfile.TemporaryDirectory(prefix="load-api-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "RAG_DATA_DIR": str(tmp / "data"), "RAG_API_TOKEN": TOKEN, "RAG_SERVE_REFRESH_SECONDS": "3",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.pop("QDRANT_URL", None)
        _write_docs(tmp / "docs", base_docs)
        built = _rag("index", str(tmp / "docs"), "--strategy", "paragraph", "--model", "minilm", env=env)
        if built.returncode:
            raise RuntimeError(f"rag index failed: {built.stderr[-500:]}")
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "orchestration.cli", "serve", "--port", str(port), "--strategy", "paragraph",
                                   "--model", "minilm", "--mode", "hybrid-rrf"], cwd=REPO, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            import httpx

            started = time.monotonic()
            while True:
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() - started > 180:
                    raise RuntimeError(f"rag serve did not start: {server.stderr.read()[-800:] if server.stderr else ''}")
                time.sleep(0.5)
            startup_s = time.monotonic() - started
            httpx.post(f"{base}/ask", json={"question": questions[0]}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
            idle_rss_mb = _proc_kib(server.pid, "VmRSS") / 1024

            out = {"latency": {"ask": [], "feedback": []}, "errors": [], "acked": []}
            stop, reindex_runs = threading.Event(), []
            reindexer = threading.Thread(target=_reindex_loop, args=(tmp / "docs", extra, env, stop, reindex_runs))
            reindexer.start()
            load_started = time.perf_counter()
            deadline = time.monotonic() + seconds

            async def load():
                rng = random.Random(0)
                await asyncio.gather(*(_client(base, questions, deadline, random.Random(rng.random()), out) for _ in range(clients)))

            asyncio.run(load())
            elapsed = time.perf_counter() - load_started
            stop.set()
            reindexer.join()
            time.sleep(8)  # a refresh period or two: the last re-index settles and is picked up
            health = httpx.get(f"{base}/health", timeout=10).json()
            metrics = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
            peak_rss_mb = _proc_kib(server.pid, "VmHWM") / 1024
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        store = FeedbackStore(f"sqlite:///{tmp / 'data' / 'feedback.sqlite'}")
        stored = set(store.table("feedback")["event_id"])
        problems = store.integrity_problems()
        store.close()

    requests = len(out["latency"]["ask"]) + len(out["latency"]["feedback"])
    missing = sorted(set(out["acked"]) - stored)
    result = {
        "clients": clients, "seconds": round(elapsed, 1), "docs": n_docs, "requests": requests,
        "requests_per_s": round(requests / elapsed, 2),
        "ask": {"count": len(out["latency"]["ask"]), **_percentiles(out["latency"]["ask"])},
        "feedback": {"count": len(out["latency"]["feedback"]), **_percentiles(out["latency"]["feedback"])},
        "errors": len(out["errors"]), "error_samples": sorted(set(out["errors"]))[:5],
        "acknowledged_feedback_rows": len(out["acked"]), "acknowledged_missing_from_store": len(missing),
        "store_integrity_problems": problems, "reindex_runs": reindex_runs,
        "index_generation_after": health.get("index", {}).get("generation"), "server_metrics": metrics["requests"],
        "api_startup_s": round(startup_s, 1), "api_idle_rss_mb": round(idle_rss_mb, 1), "api_peak_rss_mb": round(peak_rss_mb, 1),
    }
    print(f"  {clients} clients x {result['seconds']}s: {result['requests_per_s']} req/s, ask p95 {result['ask'].get('p95_ms')} ms, "
          f"feedback p95 {result['feedback'].get('p95_ms')} ms, errors {result['errors']}, "
          f"acknowledged rows missing {len(missing)}/{len(out['acked'])}")
    print(f"  re-index runs during the load: {[(r['seconds'], r['ok']) for r in reindex_runs]}; API index generation "
          f"{result['index_generation_after']}; API peak RSS {result['api_peak_rss_mb']:.0f} MB (idle {result['api_idle_rss_mb']:.0f} MB)")
    return result


def _percentiles(seconds: list[float]) -> dict:
    if not seconds:
        return {}
    ms = np.asarray(seconds) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 1), "p95_ms": round(float(np.percentile(ms, 95)), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = run(clients=args.clients, seconds=args.seconds, n_docs=args.docs, quick=args.quick)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
