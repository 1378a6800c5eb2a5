"""How trained models are released and how canaries run (rag.rollout.CanarySettings as a Dagster resource): the
promotion policy of retrain_job, traffic share, the sequential test's error rate and horizon, and the guardrails.
The state itself lives beside the model registry (rag.lifecycle.rollout)."""

from typing import Literal

from dagster import ConfigurableResource
from pydantic import Field

from rag.rollout import CanarySettings
from rag.rollout.config import promotion_policy

_DEFAULTS = CanarySettings()


class Rollout(ConfigurableResource):
    promotion: Literal["auto", "direct", "canary"] = Field(
        default_factory=promotion_policy,
        description="what production_embedder / production_reranker do with a gated candidate: 'auto' (default) "
        "promotes it when the gate found it significantly better and starts its canary when the gate found it no "
        "worse but could not show it better; 'direct' only promotes, when the gate found it significantly better "
        "(refused while a canary runs); 'canary' starts its canary on traffic_share of sessions when the gate found "
        "it no worse. canary_sensor promotes a canary only on a significant online win (env RAG_PROMOTION_POLICY)",
    )
    traffic_share: float = Field(_DEFAULTS.traffic_share, description="share of sessions a new canary serves")
    alpha: float = Field(
        _DEFAULTS.alpha,
        description="largest chance that a candidate no better than production is "
        "ever promoted, however many ticks look at it",
    )
    rollback_alpha: float | None = Field(
        _DEFAULTS.rollback_alpha,
        description="largest chance that a candidate at least as good as production is rolled back early by the "
        "one-sided harm test (null: only the two-sided test at alpha rolls back before the horizon)",
    )
    prior_a: float = _DEFAULTS.prior_a
    prior_b: float = _DEFAULTS.prior_b
    max_queries: int = Field(
        _DEFAULTS.max_queries, description="canary queries after which an undecided canary is rolled back"
    )
    max_days: float = Field(
        _DEFAULTS.max_days, description="days after which an undecided canary is rolled back (too few users)"
    )
    futility_win_share: float | None = Field(
        _DEFAULTS.futility_win_share,
        description="the smallest win share among decisive canary queries worth promoting: a canary whose evidence "
        "favours no edge over it is rolled back early, freeing the one canary slot (null: off)",
    )
    futility_beta: float = Field(
        _DEFAULTS.futility_beta, description="the chance a candidate winning futility_win_share is stopped for futility"
    )
    promotion_test: str = Field(
        _DEFAULTS.promotion_test,
        description="'two-sided' or 'one-sided': the mixture a canary's promotion must cross (one-sided: over win "
        "rates above 0.5 only, at the same alpha)",
    )
    max_latency_p95_ratio: float = _DEFAULTS.max_latency_p95_ratio
    latency_p95_allowance_ms: float = _DEFAULTS.latency_p95_allowance_ms
    min_latency_samples: int = _DEFAULTS.min_latency_samples
    max_upvote_share_drop: float = _DEFAULTS.max_upvote_share_drop
    min_votes: int = _DEFAULTS.min_votes
    max_outcomes_per_client: int = Field(
        _DEFAULTS.max_outcomes_per_client,
        description="questions one client (an address, or the user RAG_CLIENT_HEADER names) can add to a canary's "
        "evidence per client_window_days; without a window never more than could decide the canary alone",
    )
    max_sessions_per_client: int = Field(
        _DEFAULTS.max_sessions_per_client,
        description="a client that opens more sessions than this in a window adds nothing to the canary in it",
    )
    client_window_days: float | None = Field(
        _DEFAULTS.client_window_days, description="the window of the two per-client bounds (null: the whole canary)"
    )

    @property
    def gate_criterion(self) -> Literal["better", "not_worse"]:
        """What the offline gate must find before release: under 'canary' and 'auto' a candidate it finds no worse is
        released (to a canary when the gate did not find it better), and the online test decides "better"."""
        return "better" if self.promotion == "direct" else "not_worse"

    def settings(self) -> CanarySettings:
        return CanarySettings(**self.model_dump(include=set(CanarySettings.model_fields)))
