"""Pure library of the document-QA pipeline. Nothing here imports Dagster."""
