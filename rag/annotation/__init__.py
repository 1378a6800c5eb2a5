"""Expert annotation: which (question, passage) pairs experts should label next (active learning) and the queue
the expert view serves them from."""
