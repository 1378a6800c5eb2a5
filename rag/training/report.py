"""Plots and tables for training runs and gate decisions (Dagster metadata, benchmarks)."""

from __future__ import annotations

from rag.evaluation.plots import _png, _pyplot
from rag.markdown import markdown_table
from rag.training.gate import GateResult


def loss_curve(log_history: list[dict], title: str) -> bytes:
    """Training loss per logged step, and the selection metric wherever it was evaluated."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    steps = [(e["step"], e["loss"]) for e in log_history if "loss" in e and "step" in e]
    if steps:
        ax.plot(*zip(*steps), marker=".", label="train loss")
    ax.set_xlabel("step"), ax.set_ylabel("loss"), ax.set_title(title), ax.grid(alpha=0.3)
    # Embedders select on nDCG@10 (the gate's metric), cross-encoders on MRR@10, the learned ranker (one entry per
    # boosting round) on nDCG@10.
    selection = {
        "eval_dev_cosine_ndcg@10": "dev nDCG@10",
        "eval_dev_mrr@10": "dev MRR@10",
        "eval_dev_ndcg@10": "dev nDCG@10",
    }
    evals = [(e["step"], v, selection[k]) for e in log_history for k, v in e.items() if k in selection]
    if evals:
        twin = ax.twinx()
        twin.plot(
            [s for s, _, _ in evals],
            [v for _, v, _ in evals],
            marker="o" if len(evals) < 50 else None,
            color="tab:green",
            label=f"{evals[0][2]} (selection)",
        )
        twin.set_ylabel(evals[0][2]), twin.set_ylim(0, 1.02)
    return _png(fig)


def gate_table(result: GateResult) -> str:
    table = result.table.assign(
        p_value=result.table["p_value"].map(lambda v: "" if v is None or v != v else f"{v:.4f}")
    )
    if "p_value_worse" in table:
        table = table.assign(
            p_value_worse=table["p_value_worse"].map(lambda v: "" if v is None or v != v else f"{v:.4f}")
        )
    columns = ["metric", "production", "candidate", "delta", "p_value", "required", "ok"]
    if "not_worse" in table:
        columns += ["p_value_worse", "not_worse"]
    return markdown_table(table, columns, digits=4)
