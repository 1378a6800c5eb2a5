"""Bounded mutation fuzzing of the parsers over the real shared files. Prints findings; asserts nothing.

    .venv/bin/python bench/fuzz_parsers.py [--cases 300] [--seed 1] [--timeout 20]

Each case mutates a real PDF or office/text file (bit flips, truncation, inserted or duplicated byte runs,
spliced halves of two files) and parses it in a child process with a time limit. The contract: a
ParsedDocument or a ParseError with a reason; anything else (another exception, a crash of the process, a
hang) is a finding, saved under bench/results/fuzz/ so it can become a regression test in tests/.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import sys
import time
from collections import Counter
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import PDFS, RESULTS, absent, parser_files

FINDINGS = RESULTS / "fuzz"


def mutate(data: bytes, other: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    kind = rng.choice(["flip", "truncate", "insert", "duplicate", "splice", "zero"])
    if kind == "flip":
        for _ in range(rng.randint(1, 50)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del buf[rng.randrange(1, len(buf)) :]
    elif kind == "insert":
        at = rng.randrange(len(buf))
        buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 512)))
    elif kind == "duplicate":
        a = rng.randrange(len(buf))
        b = min(len(buf), a + rng.randint(1, 4096))
        buf[b:b] = buf[a:b] * rng.randint(1, 8)
    elif kind == "splice":
        buf = buf[: rng.randrange(len(buf))] + other[rng.randrange(len(other)) :]
    else:
        a = rng.randrange(len(buf))
        buf[a : a + rng.randint(1, 2048)] = b"\0" * len(buf[a : a + rng.randint(1, 2048)])
    return bytes(buf)


def _parse(path: str, queue) -> None:
    from rag.parsing import ParseError, parse_file

    try:
        doc = parse_file(path)
        queue.put(("parsed", len(doc.canonical_text)))
    except ParseError as exc:
        queue.put(("quarantined:" + exc.reason.value, 0))
    except BaseException as exc:  # the contract is broken: report it
        queue.put((f"FINDING {type(exc).__name__}: {exc}"[:300], 0))


def run_case(path: Path, timeout: float) -> str:
    queue = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=_parse, args=(str(path), queue))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return f"FINDING hang > {timeout}s"
    if proc.exitcode not in (0, None) and queue.empty():
        return f"FINDING process died with exit code {proc.exitcode}"
    return queue.get()[0] if not queue.empty() else "FINDING no result"


def run(cases: int = 300, seed: int = 1, timeout: float = 20.0) -> dict:
    """Fuzz `cases` mutated files; returns outcome counts and the saved findings (empty without ../shared)."""
    seeds = parser_files()
    if not seeds:
        absent(PDFS, "the shared PDFs and mixed documents")
        return {}
    # Import the parsers once here: every forked case then starts warm instead of paying seconds of imports.
    import rag.parsing.office  # noqa: F401
    import rag.parsing.pdf  # noqa: F401
    from unstructured.partition.auto import partition  # noqa: F401

    rng = random.Random(seed)
    work = RESULTS / "fuzz-work"
    work.mkdir(parents=True, exist_ok=True)
    outcomes: Counter[str] = Counter()
    findings = []
    started = time.perf_counter()
    for case in range(cases):
        seed_file, other = rng.choice(seeds), rng.choice(seeds)
        data = mutate(seed_file.read_bytes(), other.read_bytes(), rng)
        path = work / f"case{case}{seed_file.suffix}"
        path.write_bytes(data)
        outcome = run_case(path, timeout)
        outcomes[outcome.split(":")[0] if outcome.startswith("FINDING") else outcome] += 1
        if outcome.startswith("FINDING"):
            FINDINGS.mkdir(parents=True, exist_ok=True)
            saved = FINDINGS / f"seed{seed}-case{case}-{seed_file.name}"
            saved.write_bytes(data)
            findings.append({"file": str(saved), "outcome": outcome})
            print(f"  {outcome}  → {saved}")
        path.unlink()
    seconds = time.perf_counter() - started
    print(f"{cases} mutated files from {len(seeds)} real ones in {seconds:.0f}s:")
    for outcome, n in outcomes.most_common():
        print(f"  {n:4d}  {outcome}")
    print(f"findings: {len(findings)}")
    return {
        "cases": cases,
        "seed": seed,
        "seed_files": len(seeds),
        "seconds": round(seconds, 1),
        "outcomes": dict(outcomes),
        "findings": findings,
    }


def main() -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--cases", type=int, default=300)
    cli.add_seed(parser, 1)
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    run(args.cases, args.seed, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
