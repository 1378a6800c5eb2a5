"""What rag.training.pipeline.gate_candidate records beside a verdict's outcome, for tests that write verdicts by
hand: the gate settings (promotion re-validates them against the floors) and, for a reranker, the first-stage
embedder it re-ranked (promotion refuses a verdict over another embedder)."""

from rag.training.config import GateSettings


def sound(registry, kind: str) -> dict:
    recorded = {"settings": GateSettings().model_dump()}
    if kind == "reranker":
        recorded["first_stage_embedder"] = registry.aliases()["embedder"].get("production")
    return recorded


def won(wins: int = 60, losses: int = 10, ties: int = 0):
    """An evidence source (for rag.lifecycle.rollout.conclude) of a canary the candidate clearly won: interleaving
    outcomes, and as many paired ranking timings of equal latency (the latency guardrail can judge)."""
    from rag.rollout.evidence import CanaryEvidence

    timed = [10.0] * (wins + losses + ties)
    evidence = CanaryEvidence(
        outcomes=["b"] * wins + ["a"] * losses + ["tie"] * ties, ranking_ms={"production": timed, "canary": timed}
    )
    return lambda since: evidence
