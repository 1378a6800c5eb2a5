"""bench/gate_calibration.py's summary: the calibration targets counted from each candidate's verdict and true
effect (no data or training needed)."""

from bench.gate_calibration import summarize


def _row(name: str, passed: bool, recall: tuple[float, float], ndcg: tuple[float, float]) -> dict:
    effect = lambda delta, p: {"delta": delta, "p_value": p}  # noqa: E731
    return {
        "candidate": name,
        "gate": {"passed": passed},
        "true_effect": {"recall@5": effect(*recall), "ndcg@10": effect(*ndcg)},
    }


def test_summary_counts_accepted_losses_on_either_metric_and_rejected_gains():
    record = {
        "corpora": {
            "scifact": {
                "candidates": [
                    _row("keeps recall, ranks worse", True, (-0.01, 0.4), (-0.02, 0.04)),
                    _row("loses recall", True, (-0.04, 0.001), (-0.03, 0.001)),
                    _row("real gain held back", False, (0.05, 0.001), (0.04, 0.001)),
                    _row("real gain passed", True, (0.04, 0.01), (0.03, 0.02)),
                    _row("noise", True, (-0.02, 0.3), (-0.01, 0.3)),
                ]
            }
        }
    }
    summary = summarize(record, gain=0.03)
    assert summary["accepted"] == 4 and summary["candidates"] == 5
    assert summary["accepted_with_a_true_loss"] == ["loses recall"]
    assert summary["accepted_with_a_true_ndcg_loss"] == [
        "scifact: keeps recall, ranks worse",
        "scifact: loses recall",
    ]
    assert summary["true_gains"] == 2 and summary["true_gains_rejected"] == ["real gain held back"]
