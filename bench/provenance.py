"""The old home of bench.lib.provenance, kept for the scripts not yet converted (load_api, answers, qa_eval)."""

from bench.lib.provenance import commit, machine, rendered_or_skipped, run_record, stamp_end

__all__ = ["commit", "machine", "rendered_or_skipped", "run_record", "stamp_end"]
