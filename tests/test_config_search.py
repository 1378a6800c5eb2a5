"""Configuration search (rag.tuning): genome encoding and feasibility, operator invariants (seeded), the persistent
fitness cache, index reuse, a known optimum, `rag.search` (retrieval, a plain function), outputs, the active
configuration, CLI, assets."""

import json
import random
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from rag.evaluation.qaset import Evidence, QAItem, export_squad, to_frame
from rag.llm.testing import FakeLLM
from rag.parsing.models import ElementDraft, assemble
from rag.tuning.active import apply_configuration, history, load_active_configuration
from rag.tuning.data import corpus_workspace
from rag.tuning.evaluate import PipelineEvaluator, Scored
from rag.tuning.fitness import BudgetExhausted, Evaluations, FitnessCache
from rag.tuning.operators import (
    adaptive_rate,
    diversity,
    elite_selection,
    random_mutation,
    single_point_crossover,
    tournament_selection,
    uniform_crossover,
)
from rag.tuning.optimizers import GeneticSettings, genetic, grid
from rag.tuning.preliminary import rank_embedders, reference_passage
from rag.tuning.runner import run_search
from rag.tuning.space import SearchSpace, evaluate_check, load_space
from tests.conftest import REPO


def tiny_space(**extra) -> SearchSpace:
    return SearchSpace(
        families=[
            {
                "name": "chunking",
                "options": [{"name": "a", "params": {"strategy": "a"}}, {"name": "b", "params": {"strategy": "b"}}],
            },
            {
                "name": "retrieval",
                "options": [
                    {"name": "dense", "params": {"mode": "dense"}},
                    {"name": "bm25", "params": {"mode": "bm25"}},
                    {"name": "cc", "params": {"mode": "hybrid-cc", "alpha": 0.3}},
                ],
            },
            {"name": "reranker", "options": [{"name": "none"}, {"name": "ce", "params": {"reranker": "production"}}]},
            {
                "name": "expansion",
                "options": [{"name": "none"}, {"name": "hyde", "params": {"query_expansion": "hyde"}}],
            },
        ],
        rules=[
            {"name": "hyde-needs-llm", "when": {"expansion": ["hyde"]}, "requires": ["llm"]},
            {"name": "depth", "when": {"reranker": ["ce"]}, "check": "k >= 2 * top_k"},
        ],
        base={"k": 10, "top_k": 5},
        baseline={"retrieval": "bm25"},
        **extra,
    )


# --- genome encoding, decoding, feasibility -----------------------------------------------------------
def test_genome_roundtrip_settings_and_feasibility():
    space = tiny_space()
    assert space.sizes == [2, 3, 2, 2] and space.size == 24
    genome = space.encode({"chunking": "b", "retrieval": "cc", "expansion": "hyde"})
    assert genome == (1, 2, 0, 1)
    assert space.decode(genome) == {"chunking": "b", "retrieval": "cc", "reranker": "none", "expansion": "hyde"}
    assert space.settings(genome) == {
        "k": 10,
        "top_k": 5,
        "strategy": "b",
        "mode": "hybrid-cc",
        "alpha": 0.3,
        "query_expansion": "hyde",
    }
    assert space.baseline_genome() == (0, 1, 0, 0)
    # Without an LLM, HyDE is infeasible and repair falls back to the family default.
    assert [r.name for r, _ in space.violations(genome)] == ["hyde-needs-llm"]
    assert space.feasible(genome, {"llm"})
    assert space.repair(genome) == (1, 2, 0, 0)
    # 2 × 3 × 2 (reranker) genomes are feasible without an LLM, twice as many with one.
    assert len(list(space.feasible_genomes())) == 12 and len(list(space.feasible_genomes({"llm"}))) == 24
    # The depth rule reads the decoded settings: k=6 cannot rerank down to top_k=5.
    shallow = tiny_space().model_copy(update={"base": {"k": 6, "top_k": 5}})
    ce = shallow.encode({"reranker": "ce"})
    assert [r.name for r, _ in shallow.violations(ce)] == ["depth"] and shallow.repair(ce) == shallow.default()
    with pytest.raises(ValueError, match="does not fit"):
        space.decode((0, 3, 0, 0))
    with pytest.raises(ValueError, match="no option 'hyde2'"):
        SearchSpace(
            families=space.families, rules=[{"name": "x", "when": {"expansion": ["hyde2"]}, "requires": ["llm"]}]
        )


def test_rule_checks_are_data_not_code():
    assert evaluate_check("candidates >= 2 * k", {"candidates": 20, "k": 10})
    assert not evaluate_check("candidates >= 2 * k + 1", {"candidates": 20, "k": 10})
    for bad in ("__import__('os').system('true')", "k", "k.real >= 1", "1 < k < 3"):
        with pytest.raises(ValueError):
            evaluate_check(bad, {"k": 2})
    with pytest.raises(ValueError, match="names 'depth'"):
        evaluate_check("depth >= 1", {"k": 2})


def test_shipped_space_loads_and_prunes_llm_genes():
    space = load_space(REPO / "config" / "search_space.yaml")
    assert space.family("chunking").options[0].params == {"strategy": "recursive-1000-200"}
    plain = {space.decode(g)["query_expansion"] for g in space.feasible_genomes()}
    assert plain == {"none"}  # no LLM: expansion genes are never proposed
    assert {space.decode(g)["prompt_order"] for g in space.feasible_genomes({"generator"})} == {
        "simple",
        "long-context",
    }
    restricted = space.restrict("embedder", ["wordllama"])
    assert [o.name for o in restricted.family("embedder").options] == [
        "wordllama"
    ] and "embedder" not in restricted.baseline


# --- operators (seeded invariants) ----------------------------------------------------------------------
POP = [(0, 0, 0), (1, 2, 1), (2, 1, 0), (1, 1, 1), (0, 2, 1), (2, 2, 2)]
FIT = [0.1, 0.9, 0.5, 0.7, 0.3, 0.6]


def test_selection_invariants():
    assert elite_selection(POP, FIT, 3, random.Random(0)) == [(1, 2, 1), (1, 1, 1), (2, 2, 2)]
    picks = tournament_selection(POP, FIT, 50, random.Random(1), size=3)
    assert all(p in POP for p in picks)
    # A winner of a 3-way tournament beats at least two others: the two weakest can never win.
    assert not {(0, 0, 0), (0, 2, 1)} & set(picks)
    assert picks == tournament_selection(POP, FIT, 50, random.Random(1), size=3)


def test_crossover_invariants():
    a, b = (0, 0, 0, 0, 0, 0), (1, 1, 1, 1, 1, 1)
    rng = random.Random(2)
    children = [uniform_crossover(a, b, rng) for _ in range(200)]
    assert all(len(c) == 6 and all(g in (x, y) for g, x, y in zip(c, a, b)) for c in children)
    assert any(0 < sum(c) < 6 for c in children)  # genes really mix
    for _ in range(50):
        c = single_point_crossover(a, b, rng)
        cut = c.index(1)
        assert 1 <= cut <= 5 and c == a[:cut] + b[cut:]
    assert uniform_crossover(a, a, rng) == a


def test_mutation_invariants_and_adaptive_rate():
    sizes, genome, rng = [3, 1, 4, 2], (2, 0, 3, 1), random.Random(3)
    assert random_mutation(genome, sizes, 0.0, rng) == genome
    flipped = random_mutation(genome, sizes, 1.0, rng)
    assert flipped[1] == 0 and all(f != g for f, g, s in zip(flipped, genome, sizes) if s > 1)
    for _ in range(100):
        m = random_mutation(genome, sizes, 0.5, rng)
        assert all(0 <= g < s for g, s in zip(m, sizes))
    assert diversity([(1, 2), (1, 2)]) == 0.0 and diversity([(0, 0), (1, 1)]) == 1.0
    assert adaptive_rate(0.08, 0.0) == 0.2  # a converged population mutates at the ceiling
    assert adaptive_rate(0.08, 1.0) == pytest.approx(0.04)
    assert adaptive_rate(0.08, 0.5) == pytest.approx(0.08)
    assert adaptive_rate(0.001, 1.0) == 0.01


# --- fitness cache, budget, known optimum --------------------------------------------------------------
def synthetic_space() -> SearchSpace:
    return SearchSpace(
        families=[
            {"name": f"f{i}", "options": [{"name": f"o{j}"} for j in range(n)]} for i, n in enumerate([3, 4, 3, 3, 2])
        ],
        rules=[{"name": "no-o3-with-o2", "when": {"f1": ["o3"]}, "forbid": {"f2": ["o2"]}}],
    )


OPTIMUM = (2, 3, 1, 0, 1)


def fake_fitness(genome) -> Scored:
    """Deterministic, with an interaction: f1=o3 only pays off together with f2=o1. Unique maximum at OPTIMUM."""
    weights = [[0.0, 0.2, 0.5], [0.1, 0.3, 0.2, 0.0], [0.0, 0.1, 0.3], [0.2, 0.1, 0.0], [0.0, 0.15]]
    value = sum(w[g] for w, g in zip(weights, genome))
    if genome[1] == 3 and genome[2] == 1:
        value += 0.6
    return Scored(fitness=value, retrieval_score=value)


def counting(fn):
    calls = []

    def wrapped(genome):
        calls.append(tuple(genome))
        return fn(genome)

    return wrapped, calls


def test_known_optimum_found_by_grid_and_genetic():
    space = synthetic_space()
    feasible = list(space.feasible_genomes())
    assert OPTIMUM in feasible and max(feasible, key=lambda g: fake_fitness(g).fitness) == OPTIMUM
    assert len(feasible) == 216 - 18  # (f1=o3, f2=o2) pairs are forbidden
    fn, calls = counting(fake_fitness)
    g = grid(space, Evaluations(space, fn))
    assert g.best == OPTIMUM and len(calls) == len(feasible) and g.stopped == "exhausted"
    fn, calls = counting(fake_fitness)
    ga = genetic(space, Evaluations(space, fn, budget=60), settings=GeneticSettings(seed=42))
    assert ga.best == OPTIMUM and ga.best_scored.fitness == pytest.approx(1.55)
    assert len(calls) <= 60 and len(calls) == len(set(calls))
    assert all(space.feasible(x) for x in calls)
    assert [h["best_so_far"] for h in ga.history] == sorted(
        h["best_so_far"] for h in ga.history
    )  # elitism: never worse
    again = genetic(space, Evaluations(space, fake_fitness, budget=60), settings=GeneticSettings(seed=42))
    assert again.best == ga.best and again.history == ga.history  # seeded


def test_budget_and_target_stop():
    space = synthetic_space()
    fn, calls = counting(fake_fitness)
    res = grid(space, Evaluations(space, fn, budget=10))
    assert res.stopped == "budget" and len(calls) == 10 and res.unique_candidates == 10
    evals = Evaluations(space, fake_fitness, budget=1)
    evals(OPTIMUM)
    with pytest.raises(BudgetExhausted):
        evals((0, 0, 0, 0, 0))
    assert evals(OPTIMUM).fitness == pytest.approx(1.55)  # a seen genome costs nothing
    res = genetic(space, Evaluations(space, fake_fitness, budget=200), settings=GeneticSettings(target_fitness=1.0))
    assert res.stopped == "target" and res.best_scored.fitness >= 1.0


def test_persistent_fitness_cache_never_reevaluates(tmp_path):
    space, path = synthetic_space(), tmp_path / "fitness.sqlite"
    fn, calls = counting(fake_fitness)
    first = genetic(
        space, Evaluations(space, fn, FitnessCache(path, "ctx"), budget=40), settings=GeneticSettings(seed=7)
    )
    assert len(calls) == len(set(calls)) == first.unique_candidates == first.evaluations.computed
    fn2, calls2 = counting(fake_fitness)
    second = genetic(
        space, Evaluations(space, fn2, FitnessCache(path, "ctx"), budget=40), settings=GeneticSettings(seed=7)
    )
    assert calls2 == [] and second.evaluations.cache_hits == first.unique_candidates and second.best == first.best
    # Another context (other QA set or corpus) shares nothing.
    fn3, calls3 = counting(fake_fitness)
    grid(space, Evaluations(space, fn3, FitnessCache(path, "other"), budget=3))
    assert len(calls3) == 3 and len(FitnessCache(path, "ctx")) == first.unique_candidates
    # New weights or strategy parameters behind the same option names (the identity) are a new genome for the cache.
    fn4, calls4 = counting(fake_fitness)
    Evaluations(space, fn4, FitnessCache(path, "ctx"), identity=lambda g: "weights-v2")(first.best)
    assert calls4 == [first.best]


# --- the real pipeline on a tiny corpus (wordllama) --------------------------------------------------------
TOPICS = {
    "lighthouse": [
        "The lighthouse at Cape Wrath was built in 1828 by Robert Stevenson.",
        "Keepers lived at the lighthouse station until 1998, when the light was automated.",
    ],
    "bakery": [
        "The village bakery bakes sourdough bread from rye flour every morning.",
        "Its croissants are laminated with cultured butter over three days.",
    ],
    "volcano": [
        "Mount Etna is an active stratovolcano on the east coast of Sicily.",
        "Lava flows from Etna reached the town of Catania in 1669.",
    ],
    "chess": [
        "The Sicilian Defence is the most popular response to the king pawn opening in chess.",
        "Grandmasters study the Najdorf variation of the Sicilian for years.",
    ],
}
QUESTIONS = [
    ("lighthouse", 0, "Who built the lighthouse at Cape Wrath?", "Robert Stevenson"),
    ("lighthouse", 1, "When was the Cape Wrath light automated?", "1998"),
    ("bakery", 0, "What flour does the village bakery use for sourdough?", "rye flour"),
    ("bakery", 1, "What are the croissants laminated with?", "cultured butter"),
    ("volcano", 0, "Where is Mount Etna?", "Sicily"),
    ("volcano", 1, "Which town did lava flows from Etna reach in 1669?", "Catania"),
    ("chess", 0, "What is the most popular response to the king pawn opening?", "The Sicilian Defence"),
    ("chess", 1, "Which variation of the Sicilian do grandmasters study?", "the Najdorf variation"),
]
CHUNKING = {
    "strategies": {
        "paragraph": {"kind": "paragraph", "min_chars": 10, "max_chars": 2000, "overlap": 0},
        "whole-document": {"kind": "whole-document"},
    }
}


def corpus():
    docs = [
        assemble(
            [ElementDraft(type="title", text=t.title(), heading_level=1)]
            + [ElementDraft(type="narrative", text=p) for p in ps],
            doc_id=f"{t}.txt",
            source_path=f"{t}.txt",
            content_hash=t * 4,
            parser="test",
            n_pages=1,
        )
        for t, ps in TOPICS.items()
    ]
    by_id = {d.doc_id: d for d in docs}
    items = []
    for i, (topic, para, question, answer) in enumerate(QUESTIONS):
        text = by_id[f"{topic}.txt"].canonical_text
        start = text.index(answer)
        assert text.index(TOPICS[topic][para]) <= start  # the answer sits in that paragraph
        items.append(
            QAItem(
                qid=f"q{i}",
                question=question,
                qtype="factual",
                doc_id=f"{topic}.txt",
                answer=answer,
                evidence=[Evidence(doc_id=f"{topic}.txt", start=start, end=start + len(answer))],
            )
        )
    return docs, items


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    config = root / "chunking.yaml"
    config.write_text(yaml.safe_dump(CHUNKING))
    docs, items = corpus()
    return {
        "workspace": corpus_workspace(docs, root / "ws"),
        "items": items,
        "docs": docs,
        "config": config,
        "root": root,
    }


def pipeline_space() -> SearchSpace:
    return SearchSpace(
        families=[
            {
                "name": "chunking",
                "options": [{"name": s, "params": {"strategy": s}} for s in ("paragraph", "whole-document")],
            },
            {"name": "embedder", "options": [{"name": "wordllama", "params": {"model": "wordllama"}}]},
            {
                "name": "retrieval",
                "options": [{"name": m, "params": {"mode": m}} for m in ("dense", "bm25", "hybrid-rrf")],
            },
            {
                "name": "filter",
                "options": [{"name": "top-5", "params": {"top_k": 5}}, {"name": "top-1", "params": {"top_k": 1}}],
            },
            {"name": "prev_next", "options": [{"name": "off"}, {"name": "on", "params": {"prev_next": True}}]},
        ],
        base={"k": 10, "candidates": 20},
        baseline={"chunking": "paragraph", "retrieval": "dense"},
    )


def test_index_reuse_counts_and_hand_checked_scores(tiny, monkeypatch):
    evaluator = PipelineEvaluator(tiny["workspace"], tiny["items"], chunking_config=tiny["config"])
    space = pipeline_space()
    import rag.tuning.evaluate as ev

    built = []
    real_embed = ev.embed_step
    monkeypatch.setattr(ev, "embed_step", lambda *a, **k: built.append(a[2:4]) or real_embed(*a, **k))
    outcome = run_search("grid", evaluator, space, budget=None, out_dir=tiny["root"] / "out")
    res = outcome.result
    assert res.unique_candidates == 2 * 3 * 2 * 2 == res.evaluations.computed
    # 24 candidates, but only 2 chunk sets, 2 BM25 indexes, 2 dense collections (each embedded once) and one
    # retrieval run per (chunk set, mode); filters and neighbours reuse the runs.
    assert sorted(built) == [("paragraph", "wordllama"), ("whole-document", "wordllama")]
    assert outcome.counts == {
        "chunk_sets": 2,
        "bm25_indexes": 2,
        "dense_collections": 2,
        "distinct_indexes": 4,
        "retrieval_runs": 6,
        "rerank_runs": 0,
    }
    board = outcome.leaderboard.set_index("key")
    # One chunk per document: BM25 finds every question's document first (distinct terms), so Recall@5 = MAP@5 =
    # nDCG@5 = MRR@5 = 1 and RetrievalScore = 1 exactly; prev-next has no neighbours to add.
    whole_bm25 = space.key(space.encode({"chunking": "whole-document", "retrieval": "bm25"}))
    assert board.loc[whole_bm25, "retrieval_score"] == pytest.approx(1.0)
    # top-1 keeps one passage: Recall@5 equals the hit rate at 1 of the same run.
    top1 = space.key(space.encode({"chunking": "whole-document", "retrieval": "bm25", "filter": "top-1"}))
    assert board.loc[top1, "recall@5"] == pytest.approx(1.0) and board.loc[top1, "precision@5"] == pytest.approx(0.2)
    assert outcome.result.best_scored.fitness == pytest.approx(1.0)
    # Paragraph chunks with neighbours: the hit's previous chunk comes first, so MRR drops below the plain run's.
    para = space.encode({"chunking": "paragraph", "retrieval": "bm25"})
    para_nb = space.encode({"chunking": "paragraph", "retrieval": "bm25", "prev_next": "on"})
    assert res.evaluations.seen[para_nb].metrics["mrr@5"] < res.evaluations.seen[para].metrics["mrr@5"]
    assert res.evaluations.seen[para_nb].metrics["recall@5"] == pytest.approx(
        res.evaluations.seen[para].metrics["recall@5"]
    )
    # Outputs: YAML the answer pipeline loads, leaderboard, plot, report with baseline deltas.
    files = outcome.files
    from rag.qa import AnswerSettings

    settings = AnswerSettings.from_yaml(files["best_config"])
    winner = space.settings(res.best)
    assert (settings.strategy, settings.model, settings.mode) == (winner["strategy"], "wordllama", winner["mode"])
    assert len(pd.read_parquet(files["leaderboard"])) == 24 and files["convergence"].read_bytes()[:4] == b"\x89PNG"
    report = files["report"].read_text()
    assert "naive baseline" in report and "RetrievalScore only" in report and "| fitness |" in report
    summary = json.loads(files["summary"].read_text())
    assert summary["distinct_indexes"] == 4 and summary["unique_candidates"] == 24
    # A second search over the same workspace reuses the indexes on disk: nothing is embedded again.
    again = PipelineEvaluator(tiny["workspace"], tiny["items"], chunking_config=tiny["config"])
    again.score(space.settings(space.encode({"chunking": "paragraph", "retrieval": "dense"})))
    assert again.indexes.work["dense:paragraph|wordllama"]["added"] == 0


def test_generation_score_and_llm_genes_with_fake_llms(tiny):
    from rag.embedding import load_embedder
    from rag.tuning.generation import GenerationScorer

    answers = {q: a for _, _, q, a in QUESTIONS}
    generator = FakeLLM(lambda messages: next(a for q, a in answers.items() if q in messages[-1]["content"]))
    judge = FakeLLM("5")
    expander = FakeLLM("a passage about the question")
    evaluator = PipelineEvaluator(
        tiny["workspace"],
        tiny["items"],
        chunking_config=tiny["config"],
        llm=expander,
        generator=GenerationScorer(generator, judge, load_embedder("wordllama")),
    )
    assert {"llm", "generator"} <= evaluator.capabilities
    settings = {"strategy": "whole-document", "model": "wordllama", "mode": "bm25", "prompt_order": "long-context"}
    scored = evaluator.score(settings)
    # The generator answers with the reference, the judge says 5: GenerationScore = mean(1, 1) = 1.
    assert scored.generation_score == pytest.approx(1.0, abs=1e-5)
    assert scored.fitness == pytest.approx((scored.retrieval_score + 1.0) / 2, abs=1e-5)
    assert judge.call_count == len(QUESTIONS)
    hyde = evaluator.score(settings | {"query_expansion": "hyde"})
    assert expander.call_count == len(QUESTIONS) and hyde.retrieval_score > 0
    evaluator.score(settings | {"query_expansion": "hyde", "top_k": 1})
    assert expander.call_count == len(QUESTIONS)  # expansions and the retrieval run are cached


def test_preliminary_ranking_and_reference_passages(tiny):
    text = "Title\n\nFirst paragraph here.\n\nSecond one."
    assert reference_passage(text, text.index("paragraph"), text.index("paragraph") + 9) == "First paragraph here."
    assert reference_passage(text, text.index("one"), text.index("one") + 3) == "Second one."
    texts = {d.doc_id: d.canonical_text for d in tiny["docs"]}
    ranking = rank_embedders(tiny["items"], texts, ["wordllama"])
    row = ranking.iloc[0]
    assert row["passages"] == 8 and row["questions"] == 8 and 0 < row["mrr@10"] <= 1 and row["rank"] == 1
    evaluator = PipelineEvaluator(tiny["workspace"], tiny["items"], chunking_config=tiny["config"])
    outcome = run_search("preliminary-ranking", evaluator, pipeline_space(), budget=6)
    assert outcome.result.method == "preliminary-ranking" and outcome.result.unique_candidates == 6
    assert (
        "Preliminary ranking of embedders" in outcome.report
        and outcome.summary()["embedder_ranking"][0]["embedder"] == "wordllama"
    )


def test_rag_search_is_a_plain_function_and_tuning_a_plain_package(tiny):
    import types

    import rag.tuning.space  # noqa: F401  (the configuration-search package)

    assert isinstance(rag.search, types.FunctionType) and type(rag.tuning) is types.ModuleType
    assert rag.tuning.space.SearchSpace is SearchSpace
    ws = tiny["workspace"]
    PipelineEvaluator(ws, tiny["items"], chunking_config=tiny["config"]).score(
        {"strategy": "whole-document", "model": "wordllama", "mode": "hybrid-rrf"}
    )
    hits = rag.search(
        "Where is Mount Etna?",
        strategy="whole-document",
        model="wordllama",
        mode="hybrid-rrf",
        k=2,
        root=ws.root,
        qdrant=ws.qdrant_settings(),
    )
    assert hits[0].chunk["doc_id"] == "volcano.txt" and len(hits) == 2
    code = "import rag; print(callable(rag.search), rag.search.__doc__.split(';')[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.startswith("True Ranked chunks for `query`")


def test_active_configuration_apply_is_validated_and_logged(tmp_path):
    best = tmp_path / "best.yaml"
    best.write_text("strategy: paragraph\nmodel: wordllama\nmode: bm25\ntop_k: 3\n")
    assert load_active_configuration(tmp_path) is None
    apply_configuration(best, tmp_path, reason="first")
    best.write_text("strategy: page\nmodel: minilm\nmode: dense\n")
    entry = apply_configuration(best, tmp_path, reason="second")
    # The base embedder the search measured is served as `production`, so later promotions reach users.
    assert load_active_configuration(tmp_path) == {"strategy": "page", "model": "production", "mode": "dense"}
    assert entry["settings"]["model"] == "production" and entry["previous"]["model"] == "wordllama"
    assert entry["previous"]["strategy"] == "paragraph" and [h["reason"] for h in history(tmp_path)] == [
        "first",
        "second",
    ]
    best.write_text("strategy: paragraph\nnot_a_setting: 1\n")
    with pytest.raises(ValueError):
        apply_configuration(best, tmp_path)
    assert load_active_configuration(tmp_path)["strategy"] == "page"  # a refused config changes nothing


def test_cli_search_config_with_a_squad_folder(tiny, tmp_path, monkeypatch, capsys):
    from orchestration.cli import main

    qa = tmp_path / "qa"
    qa.mkdir()
    export_squad(tiny["items"], {d.doc_id: d.canonical_text for d in tiny["docs"]}, qa / "squad.json")
    space = tmp_path / "space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "base": {"k": 10},
                "baseline": {"retrieval": "dense"},
                "families": {
                    "chunking": {"param": "strategy", "options": ["whole-document", "paragraph"]},
                    "embedder": {"param": "model", "options": ["wordllama"]},
                    "retrieval": {"options": [{"name": "dense", "mode": "dense"}, {"name": "bm25", "mode": "bm25"}]},
                },
            }
        )
    )
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_CHUNKING_CONFIG", str(tiny["config"]))
    code = main(
        [
            "search-config",
            "--method",
            "grid",
            "--qa",
            str(qa),
            "--budget",
            "3",
            "--space",
            str(space),
            "--json",
            "--apply",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["unique_candidates"] == 3 and out["stopped"] == "budget"
    assert load_active_configuration(tmp_path / "data")["strategy"] == out["best"]["chunking"]
    assert main(["search-config", "--qa", str(tmp_path / "missing"), "--space", str(space)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    # The synthetic_qa folder: the corpus is the data dir's own parsed documents (missing ones are an error).
    from rag.store import DOCUMENTS_TABLE, TableStore

    tables = TableStore(tmp_path / "data" / "tables")
    tables.write(to_frame(tiny["items"]), "synthetic_qa")
    assert main(["search-config", "--qa", str(tables.root / "synthetic_qa"), "--space", str(space)]) == 2
    assert "not parsed under" in capsys.readouterr().err
    tables.write(tiny["workspace"].tables.read(DOCUMENTS_TABLE), DOCUMENTS_TABLE)
    assert (
        main(
            [
                "search-config",
                "--method",
                "genetic",
                "--qa",
                str(tables.root / "synthetic_qa"),
                "--budget",
                "2",
                "--space",
                str(space),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["unique_candidates"] == 2 and (tmp_path / "data" / "indexes" / "bm25").is_dir()


def test_config_search_and_active_configuration_assets(tiny, tmp_path):
    from dagster import DagsterInstance

    from orchestration.definitions import defs
    from resources.llm import LLMResource
    from resources.qdrant import QdrantResource
    from resources.storage import DataStore
    from rag.store import DOCUMENTS_TABLE, TableStore

    graph = defs.resolve_asset_graph()
    assert {
        k.to_user_string(): graph.get(k).group_name
        for k in graph.get_all_asset_keys()
        if k.to_user_string() in ("config_search", "active_configuration")
    } == {"config_search": "optimization", "active_configuration": "optimization"}
    data = tmp_path / "data"
    tables = TableStore(data / "tables")
    tables.write(tiny["workspace"].tables.read(DOCUMENTS_TABLE), DOCUMENTS_TABLE)
    tables.write(to_frame(tiny["items"]), "synthetic_qa")
    space = tmp_path / "space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "baseline": {"retrieval": "dense"},
                "families": {
                    "chunking": {"param": "strategy", "options": ["whole-document"]},
                    "embedder": {"param": "model", "options": ["wordllama"]},
                    "retrieval": {"options": [{"name": "dense", "mode": "dense"}, {"name": "bm25", "mode": "bm25"}]},
                },
            }
        )
    )
    resources = {
        "data_store": DataStore(data_dir=str(data)),
        "qdrant": QdrantResource(path=str(data / "qdrant")),
        "llm": LLMResource(backend="none"),
    }
    quiet = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    instance = DagsterInstance.ephemeral()
    import os

    os.environ["RAG_CHUNKING_CONFIG"] = str(tiny["config"])
    try:
        result = defs.resolve_job_def("config_search_job").execute_in_process(
            instance=instance,
            resources=resources,
            raise_on_error=False,
            run_config=quiet
            | {"ops": {"config_search": {"config": {"method": "grid", "space_path": str(space), "budget": 10}}}},
        )
    finally:
        del os.environ["RAG_CHUNKING_CONFIG"]
    assert result.success
    meta = result.asset_materializations_for_node("config_search")[0].metadata
    assert meta["unique_candidates"].value == 2 and meta["distinct_indexes"].value == 2
    assert "naive baseline" in meta["report"].value and meta["convergence"].value.startswith(
        "![convergence](data:image/png"
    )
    assert tables.read("config_search_leaderboard").shape[0] == 2
    assert load_active_configuration(data) is None  # a search alone never changes what serves queries
    applied = defs.resolve_job_def("apply_configuration_job").execute_in_process(
        instance=instance, resources=resources, run_config=quiet, raise_on_error=False
    )
    assert applied.success and load_active_configuration(data)["strategy"] == "whole-document"
    assert history(data)[-1]["reason"] == "applied from the config_search winner"


def test_search_scores_the_context_a_prompt_would_hold(tmp_path):
    from rag.evaluation.qaset import Relevance
    from tests.test_qa_eval import ledger

    config = tmp_path / "chunking.yaml"
    config.write_text(yaml.safe_dump(CHUNKING))
    docs, items = ledger()
    evaluator = PipelineEvaluator(corpus_workspace(docs, tmp_path / "ws"), items, chunking_config=config)
    para = evaluator.score({"strategy": "paragraph", "mode": "bm25"})
    whole = evaluator.score({"strategy": "whole-document", "mode": "bm25"})
    assert para.metrics["recall@5"] == 1.0 and para.metrics["context_chars"] < 2000
    # A whole document is cut to the prompt's 6000 characters (the other documents do not fit beside it): only the
    # questions whose answer lies in that part are hits, half of them here.
    assert all(len(d.canonical_text) > 9000 for d in docs)
    assert whole.metrics["recall@5"] == pytest.approx(0.5) and whole.metrics["context_chars"] == 6000
    assert whole.retrieval_score < para.retrieval_score
    # The budget is what differs: a prompt holding the whole of each document scores it perfect.
    assert (
        evaluator.score({"strategy": "whole-document", "mode": "bm25", "max_context_chars": 100_000}).metrics[
            "recall@5"
        ]
        == 1.0
    )
    # Fitnesses cached under another relevance rule are not reused.
    any_overlap = PipelineEvaluator(
        corpus_workspace(docs, tmp_path / "ws"), items, chunking_config=config, relevance=Relevance(mode="any")
    )
    assert any_overlap.context != evaluator.context
