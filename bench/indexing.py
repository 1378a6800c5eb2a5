"""From nothing to served on a folder of documents: what `rag index` runs (rag.pipeline.index_folder), timed per stage
(parse, chunk, BM25, chunk vectors, sentence vectors) with throughput and peak memory, beside a bare encode of the
same texts by the same model (sentence-transformers fp32 and the int8 ONNX twin) in the same run, and the ratio
product / bare. Writes its own JSON (arguments, commit, date, machine); asserts nothing. How each figure is taken:
bench/lib/indexing.py.

    .venv/bin/python bench/indexing.py --corpus scifact            # 5,183 abstracts (one Markdown file each)
    .venv/bin/python bench/indexing.py --corpus tatqa              # 555 annual-report contexts
    .venv/bin/python bench/indexing.py --corpus conditionalqa      # 59 gov.uk pages
    .venv/bin/python bench/indexing.py --corpus pdfs               # the 20 shared PDFs
    .venv/bin/python bench/indexing.py --folder ~/papers           # any folder, as `rag index ~/papers` reads it
    .venv/bin/python bench/indexing.py --corpus scifact --limit 300 --out /tmp/smoke.json   # a slice, minutes

Presets read ../shared/datasets (absent: says so and exits 0, writing nothing). The data dir is a fresh temporary
folder (RAG_DATA_DIR is set to it), removed at the end unless --keep. Default output:
bench/results/indexing-<corpus or folder name>[-<limit>].json. Measure on an otherwise idle machine: the load
average at the start and end is recorded.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS, absent
from bench.lib.indexing import PRESETS, measure, prepare
from bench.lib.provenance import run_record
from bench.lib.results import finish, log


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", choices=sorted(PRESETS), help="a document set of ../shared/datasets")
    source.add_argument("--folder", type=Path, help="a folder of documents of one's own")
    p.add_argument("--limit", type=int, help="index only this many documents (a quick run)")
    p.add_argument(
        "--strategy",
        action="append",
        dest="strategies",
        help="chunking strategy (repeatable; default paragraph, what serves; `rag index` alone builds every one)",
    )
    p.add_argument("--model", default="minilm", help="embedding model (default %(default)s, what serves)")
    p.add_argument(
        "--bare",
        nargs="*",
        choices=["fp32", "int8"],
        default=["fp32", "int8"],
        help="the bare encodes to measure beside the product (none: --bare with no value)",
    )
    p.add_argument(
        "--onnx-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="intra-op threads of the bare int8 encode (default: every core, as torch uses; the product's int8 query "
        "encoder runs RAG_ONNX_THREADS, default 1)",
    )
    p.add_argument(
        "--sentence-encoder",
        choices=["model", "int8"],
        help="who encodes the sentence vectors (default: the product's, rag.qa.encoding.DEFAULT_SENTENCE_ENCODER)",
    )
    p.add_argument("--keep", type=Path, help="build the data dir here and keep it (default: a temporary one)")
    cli.add_seed(p)
    cli.add_output(p, flags=("--out",), help="result JSON (default bench/results/indexing-<name>[-<limit>].json)")
    args = p.parse_args(argv)
    args.strategies = args.strategies or ["paragraph"]
    if args.corpus and absent(PRESETS[args.corpus], f"the {args.corpus} documents"):
        return 0
    if args.folder and not args.folder.is_dir():
        p.error(f"--folder {args.folder} is not a folder")

    name = args.corpus or args.folder.resolve().name
    out = args.out or RESULTS / f"indexing-{name}{'' if args.limit is None else f'-{args.limit}'}.json"
    import torch

    record = run_record(args, torch_threads=torch.get_num_threads(), onnx_threads_bare=args.onnx_threads)
    work = Path(args.keep or tempfile.mkdtemp(prefix="indexing-"))
    if args.keep:
        work.mkdir(parents=True, exist_ok=True)
    root = work / "data"
    if root.exists() and any(root.iterdir()):
        p.error(f"{root} is not empty: the bench indexes from nothing")
    os.environ["RAG_DATA_DIR"] = str(root)  # the registry, the int8 export and the serving defaults read it
    try:
        docs, record["corpus"] = prepare(work, corpus=args.corpus, folder=args.folder, limit=args.limit, seed=args.seed)
        log(f"indexing {docs} into {root}")
        record |= measure(
            docs,
            root,
            strategies=args.strategies,
            model=args.model,
            bare=args.bare,
            onnx_threads=args.onnx_threads,
            sentence_encoder=args.sentence_encoder,
        )
        parse = next(r for r in record["stages"] if r["stage"] == "parse")
        record["corpus"] |= {"files": parse["files"], "bytes": parse["bytes"], "documents": parse["items"]}
        finish(record, out, lambda r: None)
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
