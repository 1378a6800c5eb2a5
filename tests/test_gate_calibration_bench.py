"""bench/gate_calibration.py's summary: the calibration targets counted from each candidate's verdict and true
effect (no data or training needed)."""

from bench.gate_calibration import summarize


def _row(name: str, passed: bool, recall: tuple[float, float], ndcg: tuple[float, float], outcome: str = "") -> dict:
    effect = lambda delta, p: {"delta": delta, "p_value": p}  # noqa: E731
    return {
        "candidate": name,
        "gate": {"passed": passed, "outcome": outcome or ("better" if passed else "worse")},
        "true_effect": {"recall@5": effect(*recall), "ndcg@10": effect(*ndcg)},
    }


def test_summary_counts_accepted_losses_on_either_metric_and_rejected_or_held_gains():
    record = {
        "corpora": {
            "scifact": {
                "candidates": [
                    _row("keeps recall, ranks worse", True, (-0.01, 0.4), (-0.02, 0.04)),
                    _row("loses recall", True, (-0.04, 0.001), (-0.03, 0.001)),
                    _row("real gain rejected", False, (0.05, 0.001), (0.04, 0.001)),
                    _row("real gain for the canary", False, (0.06, 0.001), (0.05, 0.001), "inconclusive"),
                    _row("real gain passed", True, (0.04, 0.01), (0.03, 0.02)),
                    _row("noise", True, (-0.02, 0.3), (-0.01, 0.3)),
                ]
            }
        }
    }
    summary = summarize(record, gain=0.03)
    assert summary["accepted"] == 4 and summary["candidates"] == 6
    assert summary["accepted_with_a_true_loss"] == ["loses recall"]
    assert summary["accepted_with_a_true_ndcg_loss"] == [
        "scifact: keeps recall, ranks worse",
        "scifact: loses recall",
    ]
    assert summary["true_gains"] == 3 and summary["true_gains_rejected"] == ["scifact: real gain rejected"]
    assert summary["true_gains_held_for_the_canary"] == ["scifact: real gain for the canary"]
