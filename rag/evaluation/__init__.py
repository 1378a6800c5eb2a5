"""Evaluation: IR metrics with ranx, BEIR datasets."""
