"""bench/replica_swap.py's measuring helpers: the longest time without an answer around a window, and the
stopwatch that times the functions ServingIndex calls without changing them."""

import types

import pytest

from bench.replica_swap import Stopwatch, window_stats


def test_the_longest_gap_counts_the_answers_around_the_window_and_errors_inside_it():
    # (start, end, ok, generation): answers end at 1.0, 1.1, 1.5 (an error ends at 1.3), 2.5, 2.6
    events = [
        (0.9, 1.0, True, 1),
        (1.05, 1.1, True, 1),
        (1.2, 1.3, False, 1),
        (1.4, 1.5, True, 1),
        (2.45, 2.5, True, 2),
        (2.55, 2.6, True, 2),
    ]
    during = window_stats(events, 1.6, 2.0)
    assert during["max_gap_ms"] == pytest.approx(1000.0)  # 1.5 -> 2.5 overlaps the window though no answer is in it
    assert during["answered"] == 0 and during["errors"] == 0
    before = window_stats(events, 0.8, 1.45)
    assert before["max_gap_ms"] == pytest.approx(400.0)  # 1.1 -> 1.5: the error in between is no answer
    assert before["errors"] == 1 and before["answered"] == 3
    assert before["latency_max_ms"] == pytest.approx(100.0)


def test_the_stopwatch_sums_time_per_name_and_puts_the_functions_back():
    module = types.SimpleNamespace(work=lambda x: x * 2)
    real = module.work
    watch = Stopwatch()
    watch.wrap(module, "work", "w")
    assert module.work(3) == 6 and module.work(4) == 8
    spent = watch.take()
    assert set(spent) == {"w"} and spent["w"] >= 0 and watch.take() == {}
    watch.restore()
    assert module.work is real


def test_the_gap_probe_sees_a_step_that_holds_the_gil_and_not_one_that_waits():
    import time

    from bench.replica_open_pause import GapProbe, timed

    probe = GapProbe()
    probe.start()
    try:
        time.sleep(0.05)
        _, waiting = timed(probe, lambda: time.sleep(0.3))  # releases the GIL: the probe keeps waking
        _, holding = timed(probe, lambda: sum(range(30_000_000)))  # one C call: no other thread runs meanwhile
    finally:
        probe.stop.set()
    assert holding["max_gap_ms"] >= 0.8 * 1000 * holding["seconds"]
    assert waiting["max_gap_ms"] < 0.5 * holding["max_gap_ms"] and waiting["seconds"] >= 0.3
