"""Parse a list of files, PDFs in parallel processes when more than one core is free.

A PDF takes seconds to minutes (layout, tables, OCR) and one core; text formats take milliseconds. So when more than
one PDF is to be parsed and more than one core is free (`RAG_PARSE_PROCESSES`, default: the cores this process may use
that the load average does not show busy), the PDFs go to a pool of processes while this process parses the others.
The processes are spawned, not forked, so they inherit no lock held by another thread of a Dagster run or a server.

What a file's parse raises is the same in a process as here: ParseError quarantines the file, ParserBug fails the
run (both cross the process boundary whole). A parse that kills its process (a crash in a native library, the system
killing it for memory) breaks the whole pool, so every file the pool had not finished is parsed again, each alone in
a fresh process: the one that kills its process again is quarantined as parser-error, the others are parsed. Unless
no process can start at all (a script without a main guard: each spawned process imports it and dies): then those
files are parsed here, with a warning, rather than quarantined for the environment's fault.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from rag.parsing.errors import ParseError, ParserBug, QuarantineReason
from rag.parsing.models import ParsedDocument
from rag.parsing.settings import ParseSettings, int_from_env

log = logging.getLogger(__name__)

PROCESSES_ENV = "RAG_PARSE_PROCESSES"
Outcome = ParsedDocument | ParseError


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (a container's or taskset's share)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def free_cores() -> int:
    """The available cores others do not keep busy: the 1-minute load average counts this process, so one of its
    runnable tasks is taken to be ours. On a 2-core machine another job keeps busy, processes only add their start-up
    (measured: 20 PDFs took 11.3 s in two processes against 9.9 s in one)."""
    cores = available_cores()
    try:
        others = max(0.0, os.getloadavg()[0] - 1.0)
    except OSError:  # no load average (not Unix)
        return cores
    return max(1, min(cores, int(cores - others)))


def parse_processes() -> int:
    """How many processes may parse PDFs at once: RAG_PARSE_PROCESSES (1 keeps every parse in this process), else
    the free cores (free_cores)."""
    return max(1, int_from_env(PROCESSES_ENV, free_cores()))


def parse_here(f, parse: Callable[..., ParsedDocument], settings: ParseSettings) -> Outcome:
    """One file's document, or the ParseError that quarantines it; ParserBug propagates."""
    try:
        return parse(f.path, settings, doc_id=f.doc_id, content_hash=f.content_hash)
    except ParseError as exc:  # the file's fault: returned, so the caller quarantines it and goes on
        return exc
    except ParserBug:
        raise
    except Exception as exc:  # a parse function outside rag.parsing: not known to be the file's fault
        raise ParserBug(str(f.path), exc) from exc


def _spawned(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def _crashed(f) -> ParseError:
    return ParseError(
        QuarantineReason.PARSER_ERROR,
        "the process parsing this file died (a crash in a native parser library, or killed for lack of memory); "
        f"it was retried alone and died again. Check the file opens elsewhere, or remove {f.path.name} from the folder",
    )


def parse_alone(f, parse: Callable[..., ParsedDocument], settings: ParseSettings) -> Outcome:
    """Parse in a process of its own: a file that kills it is quarantined and nothing else is lost."""
    with _spawned(1) as pool:
        try:
            return pool.submit(parse_here, f, parse, settings).result()
        except BrokenProcessPool:
            return _crashed(f)


def processes_start() -> bool:
    """Whether a spawned process starts and answers here. It does not where spawning is broken, e.g. in a script
    without a main guard: each process imports the script, which starts processes again, and dies."""
    with _spawned(1) as pool:
        try:
            return pool.submit(os.getpid).result(timeout=300) > 0
        except (BrokenProcessPool, TimeoutError):
            return False


def _picklable(parse: Callable) -> bool:
    """Whether `parse` can reach another process (a module-level function can; a closure or lambda cannot)."""
    try:
        pickle.dumps(parse)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


class PdfPool:
    """The PDFs of a parse, submitted to processes on entry and collected by `results`; a pool is started only when
    it pays (two PDFs or more, two processes or more, and a `parse` that can reach them)."""

    def __init__(self, files: list, parse: Callable[..., ParsedDocument], settings: ParseSettings):
        pdfs = [f for f in files if f.path.suffix.lower() == ".pdf"]
        self.workers = min(parse_processes(), len(pdfs))
        self.files = pdfs if self.workers > 1 and _picklable(parse) else []
        self._ids = {f.doc_id for f in self.files}
        self.parse, self.settings = parse, settings
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[Future, object] = {}

    def __contains__(self, f) -> bool:
        return f.doc_id in self._ids

    def start(self, on_start: Callable[[str], None] | None) -> PdfPool:
        if self.files:
            log.info("parsing %d PDFs in %d processes", len(self.files), self.workers)
            self._pool = _spawned(self.workers)
            for f in self.files:
                if on_start:
                    on_start(f.doc_id)
                self._futures[self._pool.submit(parse_here, f, self.parse, self.settings)] = f
        return self

    def results(self, on_done: Callable[[object], None]) -> dict[str, Outcome]:
        outcomes: dict[str, Outcome] = {}
        broken = []
        for future in as_completed(self._futures):
            f = self._futures[future]
            try:
                outcomes[f.doc_id] = future.result()
            except BrokenProcessPool:
                broken.append(f)
                continue
            on_done(f)
        self.close()
        retry = parse_alone
        if broken and processes_start():
            log.warning("a PDF parse killed its process: parsing %d PDFs again, one process each", len(broken))
        elif broken:
            log.warning(
                "parse processes die as they start here, so %d PDFs are parsed in this process instead. A script "
                'that parses must call it under `if __name__ == "__main__":` (spawned processes import the '
                "script), or set %s=1",
                len(broken),
                PROCESSES_ENV,
            )
            retry = parse_here
        for f in sorted(broken, key=lambda f: f.doc_id):
            outcomes[f.doc_id] = retry(f, self.parse, self.settings)
            on_done(f)
        return outcomes

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> PdfPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse_files(
    files: list,
    settings: ParseSettings,
    parse: Callable[..., ParsedDocument],
    *,
    on_start: Callable[[str], None] | None = None,
    on_done: Callable[[object], None] = lambda f: None,
) -> dict[str, Outcome]:
    """doc_id -> document or ParseError for each of `files` (rag.source.SourceFile). `on_start(doc_id)` before a file
    is parsed (or sent to a process), `on_done(file)` after. Raises ParserBug from any of them, after stopping the
    processes."""
    outcomes: dict[str, Outcome] = {}
    with PdfPool(files, parse, settings) as pool:
        pool.start(on_start)
        for f in files:
            if f in pool:
                continue
            if on_start:
                on_start(f.doc_id)
            outcomes[f.doc_id] = parse_here(f, parse, settings)
            on_done(f)
        outcomes.update(pool.results(on_done))
    return outcomes
