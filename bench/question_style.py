"""Do synthetic questions look like people's? SQuAD v1.1 dev articles as documents: the default no-LLM question
mix of rag.synthetic is generated over them and rag.synthetic.style measures every kind beside SQuAD's human
questions on the same articles (copy share, overlap with the evidence paragraph, words, question form).

    .venv/bin/python bench/question_style.py [--articles 24] [--passages 8] [--seed 42] [--json PATH]
    .venv/bin/python bench/question_style.py --table bench/results/question-style-squad.json   # README table

Data: ../shared/datasets/squad-dev/dev-v1.1.json.gz; without it the run prints a message and exits 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS, SQUAD, absent
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import write

OUT = RESULTS / "question-style-squad.json"
HUMAN = "squad (human)"
COLUMNS = (
    ("n", "questions"),
    ("copy_share", "copies of a sentence"),
    ("mean_overlap", "content words in the paragraph"),
    ("mean_words", "words"),
    ("question_form_share", "question form"),
)


def markdown_table(record: dict) -> str:
    """The per-type figures of a result file as a Markdown table, human questions last."""
    style = record["style"]
    order = [t for t in style if t != HUMAN] + [HUMAN]
    head = "| kind | " + " | ".join(label for _, label in COLUMNS) + " |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for qtype in order:
        figures = style[qtype]
        cells = [
            f"{figures[key]:.0%}" if key.endswith("share") or key == "mean_overlap" else f"{figures[key]:g}"
            for key, _ in COLUMNS
        ]
        rows.append(f"| {qtype} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def measure(args: argparse.Namespace) -> dict:
    from rag.evaluation.loaders import squad_articles
    from rag.synthetic import SynthSettings, generate_qa
    from rag.synthetic.style import report, samples_of

    docs, human = squad_articles(SQUAD)
    picked = sorted(random.Random(args.seed).sample(range(len(docs)), min(args.articles, len(docs))))
    docs = [docs[i] for i in picked]
    by_id = {d.doc_id: d for d in docs}
    human = [q for q in human if q.doc_id in by_id]
    settings = SynthSettings(passages_per_document=args.passages, seed=args.seed)
    started = time.perf_counter()
    result = generate_qa(docs, None, settings)
    seconds = time.perf_counter() - started
    style = report(samples_of(result.items, by_id) + samples_of(human, by_id, qtype=HUMAN))
    examples: dict[str, list[dict]] = {}
    for item in result.items:
        if len(examples.setdefault(item.qtype, [])) < 4:
            examples[item.qtype].append({"question": item.question, "answer": item.answer})
    return {
        "data": {"articles": [d.doc_id for d in docs], "human_questions": len(human)},
        "generation": {
            **result.summary,
            "mix": result.mix,
            "seconds": round(seconds, 1),
            "fallbacks_by_kind": dict(result.fallbacks),
        },
        "style": style,
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--articles", type=int, default=24, help="SQuAD dev articles sampled as documents (dev has 48)")
    parser.add_argument("--passages", type=int, default=8, help="passages sampled per article (passages_per_document)")
    parser.add_argument("--seed", type=int, default=42, help="article sample and generation seed")
    cli.add_output(parser, OUT, flags=("--json",), help="where the figures go")
    parser.add_argument("--table", type=Path, help="print the Markdown table of this result file and stop")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.table.read_text())))
        return 0
    if absent(SQUAD, "SQuAD v1.1 dev"):
        return 0
    record = run_record(args)
    record.pop("args", None)
    record["args"] = {k: str(v) for k, v in vars(args).items() if k != "table"}
    record.update(measure(args))
    write(stamp_end(record), args.json, indent=2)
    print(markdown_table(record))
    print(
        f"\n{record['generation']['questions']} synthetic questions in {record['generation']['seconds']} s; "
        f"written to {args.json}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
