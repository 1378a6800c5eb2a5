from setuptools import find_packages, setup

setup(
    name="rag-pipeline",
    version="0.1.0",
    description="Self-improving document question answering on Dagster",
    python_requires=">=3.11",
    packages=find_packages(include=["rag*", "assets*", "resources*", "sensors*", "orchestration*"]),
    include_package_data=True,
    entry_points={"console_scripts": ["rag=orchestration.cli:main"]},
)
