"""Where tables live: one data directory (RAG_DATA_DIR, default ./data) holding every table."""

from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from rag.store import TableStore, data_dir


class DataStore(ConfigurableResource):
    """Parquet tables under `<data_dir>/tables/<table>[/<partition>]/data.parquet`."""

    data_dir: str = Field(default_factory=lambda: str(data_dir()), description="Root of all pipeline data.")

    @property
    def root(self) -> Path:
        return Path(self.data_dir)

    @property
    def tables(self) -> TableStore:
        return TableStore(f"{self.data_dir}/tables")
