"""Benchmarks: one script per question, each a thin main() over bench.lib, writing its own result JSON.

Run a script as `.venv/bin/python bench/<name>.py` or `python -m bench.<name>`; bench is installed with the package
(setup.py), so no script edits the import path.
"""
