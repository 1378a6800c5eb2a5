"""The model lifecycle, in one place above training (which only trains, gates and records):

- verdicts: whether a candidate's recorded gate verdict lets it replace production now;
- promotion: production moves (collections built, serving aliases and the registry alias swapped) as one
  journaled transaction;
- rollout: a canary's start, its conclusion (the evidence re-read) and the operator's rollback;
- journal: the intent written before any step and recovery on the next open, so no change half-happens;
- target: where production is served from (the chunk sets and the Qdrant holding their collections).

The canary's statistics (interleaving, the sequential test, guardrails, evidence) stay in rag.rollout; the
registry's storage (MLflow) in rag.registry."""
