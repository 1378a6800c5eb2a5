"""A deliberately worse model for rehearsing a rollback (and for tests of the gate and the canary)."""

from __future__ import annotations

from pathlib import Path


def noisy_copy(source: str | Path, out: str | Path, scale: float, seed: int = 0) -> Path:
    """Save a copy of the sentence-transformers model at `source` into `out` with Gaussian noise on every weight
    tensor, `scale` x that tensor's own standard deviation (seeded): the same architecture, measurably worse."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(source), device="cpu", local_files_only=True)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() > 1:
                param.add_(torch.randn(param.shape, generator=generator) * scale * param.std())
    model.save(str(out))
    return Path(out)
