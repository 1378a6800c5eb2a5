"""What the benchmark scripts share, so that no script imports another:

datasets     where the shared data sets live (SciFact, SQuAD dev) and a clear skip when one is absent
cli          the argument parser and the options most scripts take (--out, --seed, --quick, --markdown)
provenance   what a result file records about the code and machine that produced it
results      logging, latency statistics and atomic result writing
indexing     index_folder's stages timed from nothing to served, and the bare encodes beside them
edge         SciFact vectors made into N points, built into an embedded Qdrant collection as the product builds it
feedback     the SciFact feedback-loop slice: data, base deployment, the API replay and the test nDCG@10
scores       per-query retrieval scores
"""
