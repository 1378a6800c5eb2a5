from setuptools import find_packages, setup

setup(
    name="rag-pipeline",
    version="0.1.0",
    description="Self-improving document question answering on Dagster",
    python_requires=">=3.11",
    # bench: the benchmark scripts and their shared library (bench.lib), importable from anywhere without sys.path
    # edits.
    packages=find_packages(include=["rag*", "assets*", "resources*", "sensors*", "orchestration*", "bench*"]),
    include_package_data=True,
    # rag.progress draws terminal bars with tqdm: it comes with sentence-transformers, declared because rag imports it.
    install_requires=["tqdm>=4.60"],
    entry_points={"console_scripts": ["rag=orchestration.cli:main"]},
)
