"""The document source: a folder scanned recursively, with parse settings (limits, passwords)."""

import json
import os
from pathlib import Path

import yaml
from dagster import ConfigurableResource
from pydantic import Field

from rag.parsing import ParseSettings
from rag.source import SourceScan, scan_folder

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_CORPUS = REPO_ROOT / "sample_corpus"


class DocumentSource(ConfigurableResource):
    """Documents under `path` (env RAG_DOCS_DIR; default: the bundled sample corpus)."""

    path: str = Field(default_factory=lambda: os.environ.get("RAG_DOCS_DIR", str(SAMPLE_CORPUS)))
    max_file_bytes: int = 200 * 1024 * 1024
    max_pages: int = 1000
    # YAML mapping doc_id (or glob) -> password. Kept out of Dagster config so secrets stay off the UI;
    # RAG_PDF_PASSWORDS (JSON object) is merged on top for deployments that inject secrets by env.
    passwords_file: str = Field(
        default_factory=lambda: os.environ.get("RAG_PDF_PASSWORDS_FILE", str(REPO_ROOT / "config" / "passwords.yaml"))
    )

    def scan(self, with_hashes: bool = True) -> SourceScan:
        return scan_folder(Path(self.path), with_hashes=with_hashes)

    def parse_settings(self) -> ParseSettings:
        passwords: dict[str, str] = {}
        file = Path(self.passwords_file)
        if file.exists():
            loaded = yaml.safe_load(file.read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{file} must be a mapping of doc_id (or glob) to password")
            passwords.update({str(k): str(v) for k, v in loaded.items()})
        if os.environ.get("RAG_PDF_PASSWORDS"):
            passwords.update(json.loads(os.environ["RAG_PDF_PASSWORDS"]))
        return ParseSettings(max_file_bytes=self.max_file_bytes, max_pages=self.max_pages, pdf_passwords=passwords)
