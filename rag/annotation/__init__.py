"""Expert annotation: which (question, passage) pairs experts should label next (active learning) and the queue
the expert view serves them from.

    questions (production queries, else synthetic)  → candidates.py (the served top k of each)
    → signals.py (uncertainty per pair) → select.py (active / uncertainty / random) → queue.py (queue.json)

build.py runs those steps (the `annotation_queue` asset and bench/active_learning.py call it); served.py opens the
ranking that serves; report.py says what a refresh covers and what experts labelled since the previous one.
"""
