"""Deliberately harmful models: what a gate must reject and a canary must roll back (bench/gate_calibration.py's
controls, bench/loop.py's harm drill)."""

from __future__ import annotations

import dataclasses
import random
import tempfile
from pathlib import Path


def shuffled_reranker(tables, registry, seed: int, log, strategy: str | None = None):
    """A learned ranker trained with every question paired to another question's passage: it learns noise. Registered
    in `registry` (not aliased); returns its version."""
    from rag.training import RerankerTrainingConfig
    from rag.training.ltr import train_learned_ranker
    from rag.training.pipeline import _manifest, aliased_embedder, load_inputs

    config = RerankerTrainingConfig(strategy=strategy, seed=seed)
    inputs = load_inputs(tables, config)
    passages = [p for _, p in inputs.data.positives]
    random.Random(seed).shuffle(passages)
    data = dataclasses.replace(inputs.data, positives=[(q, p) for (q, _), p in zip(inputs.data.positives, passages)])
    with tempfile.TemporaryDirectory() as scratch:
        run = train_learned_ranker(
            data,
            config,
            Path(scratch) / "model",
            chunks=inputs.chunks,
            embedder=aliased_embedder(registry, "production"),
            log=log,
        )
        return registry.register("reranker", run.model_dir, _manifest("reranker", config, inputs, run, None))
