"""Gradual rollout (canary) of a trained model, as a pure library.

A model that passed the offline gate (rag.training.gate; on feedback questions scored on condensed lists, see
rag.rollout.condensed) goes through these stages of a RolloutState:

    candidate ──start_canary──▶ canary ──promote──▶ production
        │                         │
        └──────roll_back──────────┴──roll_back──▶ rolled_back

- candidate: passed the gate, serves nobody yet.
- canary: serves `traffic_share` of sessions (default 10 %), chosen by assign_arm from a hash of the session id.
  Inside the canary share production's and the candidate's rankings are team-draft interleaved; clicks and
  passage ratings credit the team that contributed the passage, giving one outcome per query (win / loss / tie).
  On every tick sequential_decision (an always-valid mSPRT on those outcomes, with a one-sided harm test that
  rolls a losing candidate back on weaker evidence, and optionally Wald's futility boundary that rolls back one
  whose evidence favours no edge worth a canary) says promote, roll back or continue, and guardrails (latency
  p95, answer up-vote share) force a rollback when breached.
- production / rolled_back: final. The other arm serves everyone; a new candidate starts a new rollout.

Wiring (imported on use, not here): rag.lifecycle.rollout keeps each kind's state beside the model registry and runs
the steps (start, conclude, roll_back_rollout); rag.rollout.evidence reads a canary's outcomes and guardrail inputs
from the feedback store; rag.serving.canary routes API sessions; rag.rollout.cli is `rag models rollout`.
"""

from rag.rollout.condensed import OfflineComparison, RunScores, compare_offline, condensed_run, score_run
from rag.rollout.config import CanarySettings
from rag.rollout.guardrails import Breach, Votes, guardrail_breaches, with_guardrails
from rag.rollout.interleaving import QueryCredit, Shown, credit, seed_from, tally, team_draft_interleave
from rag.rollout.sequential import (
    Decision,
    log_harm_ratio,
    log_likelihood_ratio,
    queries_to_decide,
    replay,
    sequential_decision,
)
from rag.rollout.state import (
    IllegalTransition,
    RolloutState,
    arm_for,
    assign_arm,
    promote,
    roll_back,
    start_canary,
    version_for,
)

__all__ = [
    "CanarySettings",
    "condensed_run",
    "compare_offline",
    "score_run",
    "OfflineComparison",
    "RunScores",
    "team_draft_interleave",
    "credit",
    "tally",
    "seed_from",
    "Shown",
    "QueryCredit",
    "sequential_decision",
    "replay",
    "queries_to_decide",
    "log_likelihood_ratio",
    "log_harm_ratio",
    "Decision",
    "guardrail_breaches",
    "with_guardrails",
    "Breach",
    "Votes",
    "RolloutState",
    "IllegalTransition",
    "start_canary",
    "promote",
    "roll_back",
    "assign_arm",
    "arm_for",
    "version_for",
]
