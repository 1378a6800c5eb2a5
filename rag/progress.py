"""Progress of long loops: the library reports counts, whoever runs it decides how to show them.

A library function that loops over many items takes `progress: Progress | None = None` and reports
`progress(task, done, total, unit)` (through `counter`, which does nothing when `progress` is None), e.g.
`progress("embedding paragraph|minilm", 1200, 5000, "chunks")`. The task names the stage ("parsing", "chunking
paragraph", "embedding paragraph|minilm", "sentence vectors paragraph|minilm"); a stage that reads files also says how
many bytes it has read (`nbytes`), and the sinks show its data rate beside the item rate ("parsing: 40/98 documents,
3.1/s, 0.70 MB/s, ETA 19 s"). Nothing here imports Dagster; the sinks are:

- `LogProgress(log)`: a plain line through `log` at most every `interval` seconds per task
  ("embedding paragraph|minilm: 1200/5000 chunks, 85.0/s, ETA 45 s") and a closing line for a task that printed one;
  Dagster assets pass `LogProgress(context.log.info)`, the CLI uses it when stderr is not a terminal.
- `BarProgress()`: a tqdm bar per task (rate and ETA) on a terminal; shown only for a task that runs longer than
  `delay`.
- `cli_progress()`: the bar on a terminal, periodic lines otherwise. Both write to stderr, so `--json` output stays
  clean.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TextIO


class Progress(Protocol):
    def __call__(self, task: str, done: int, total: int | None, unit: str = "items") -> None: ...


def takes_bytes(progress: Progress) -> bool:
    """Whether a sink takes the `nbytes` keyword (LogProgress and BarProgress do; a plain Progress need not)."""
    try:
        params = inspect.signature(progress).parameters
    except (TypeError, ValueError):
        return False
    return "nbytes" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def counter(progress: Progress | None, task: str, total: int | None, unit: str = "items") -> Callable[..., None]:
    """Report `0/total` now and return `advance(n=1, nbytes=0)`, which adds n items (and nbytes bytes read) and
    reports the new counts (no-op without `progress`, or when there is nothing to do: total 0). Bytes reach only a
    sink that takes them (takes_bytes)."""
    if progress is None or total == 0:
        return lambda n=1, nbytes=0: None
    done, volume = 0, 0
    sized = takes_bytes(progress)
    progress(task, 0, total, unit)

    def advance(n: int = 1, nbytes: int = 0) -> None:
        nonlocal done, volume
        done, volume = done + n, volume + nbytes
        if sized and volume:
            progress(task, done, total, unit, nbytes=volume)
        else:
            progress(task, done, total, unit)

    return advance


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def byte_rate(bytes_per_second: float) -> str:
    mb = bytes_per_second / 1e6
    return f"{mb:.2f} MB/s" if mb < 1 else f"{mb:.1f} MB/s"


def progress_line(
    task: str,
    done: int,
    total: int | None,
    unit: str,
    elapsed: float,
    rate: float | None,
    bytes_per_second: float | None = None,
) -> str:
    """`embedding x: 1200/5000 chunks, 85.0/s, ETA 45 s` (or `..., done in 58 s` once done reaches total); with
    `bytes_per_second`, the data rate after the item rate (`parsing: 40/98 documents, 3.1/s, 0.70 MB/s, ETA 19 s`)."""
    count = f"{done}/{total}" if total else f"{done}"
    parts = [f"{task}: {count} {unit}"]
    if rate:
        parts.append(f"{rate:.1f}/s" if rate < 100 else f"{rate:.0f}/s")
    if bytes_per_second:
        parts.append(byte_rate(bytes_per_second))
    if total and done >= total:
        parts.append(f"done in {duration(elapsed)}")
    elif total and rate:
        parts.append(f"ETA {duration((total - done) / rate)}")
    return ", ".join(parts)


@dataclass
class _Task:
    started: float
    first_done: int
    last_line: float | None = None  # when this task last printed (None: not yet)


class LogProgress:
    """Plain, rate-limited lines through `log`: per task, the first after `interval` seconds, then at most one per
    `interval`, and a closing line when a task that printed before reaches its total. Tasks shorter than `interval`
    print nothing. `clock` is injectable for tests."""

    def __init__(self, log: Callable[[str], None], interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.log, self.interval, self.clock = log, interval, clock
        self._tasks: dict[str, _Task] = {}

    def __call__(self, task: str, done: int, total: int | None, unit: str = "items", nbytes: int | None = None) -> None:
        now = self.clock()
        state = self._tasks.get(task)
        if state is None or done < state.first_done:  # a new task, or the same name started over
            state = self._tasks[task] = _Task(now, done)
        finished = bool(total) and done >= total
        since = now - (state.last_line if state.last_line is not None else state.started)
        if (finished and state.last_line is not None) or (not finished and since >= self.interval):
            elapsed = now - state.started
            rate = (done - state.first_done) / elapsed if elapsed > 0 and done > state.first_done else None
            data = nbytes / elapsed if nbytes and elapsed > 0 else None  # bytes count from the task's start, as done
            self.log(progress_line(task, done, total, unit, elapsed, rate, data))
            state.last_line = now
        if finished:
            del self._tasks[task]

    def close(self) -> None:
        self._tasks.clear()

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BarProgress:
    """A tqdm bar (count, rate, ETA) for the running task; a new task closes the previous bar. Bars disappear when
    their task completes, and a task shorter than `delay` seconds never shows one."""

    def __init__(self, file: TextIO | None = None, delay: float = 1.0, mininterval: float = 0.1):
        self.file, self.delay, self.mininterval = file or sys.stderr, delay, mininterval
        self._task: str | None = None
        self._started = 0.0
        self._bar = None

    def __call__(self, task: str, done: int, total: int | None, unit: str = "items", nbytes: int | None = None) -> None:
        from tqdm import tqdm

        if task != self._task or self._bar is None or done < self._bar.n:
            self.close()
            self._task, self._started = task, time.monotonic()
            self._bar = tqdm(
                total=total or None,
                initial=done,
                desc=task,
                unit=f" {unit}",
                file=self.file,
                delay=self.delay,
                mininterval=self.mininterval,
                leave=False,
                dynamic_ncols=True,
            )
        if nbytes and (elapsed := time.monotonic() - self._started) > 0:
            self._bar.set_postfix_str(byte_rate(nbytes / elapsed), refresh=False)
        self._bar.update(done - self._bar.n)
        if total and done >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._task = None, None

    def __enter__(self) -> BarProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _columns(stream: TextIO) -> int | None:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's stream), or not a terminal
        return None


def cli_progress(stream: TextIO | None = None, interval: float = 10.0) -> BarProgress | LogProgress:
    """What a command shows: a bar when `stream` (default stderr) is a terminal, else a line every `interval`
    seconds."""
    stream = stream or sys.stderr
    if stream.isatty() and _columns(stream) != 0:  # a pseudo-terminal of width 0 would show an empty bar
        return BarProgress(stream)
    return LogProgress(lambda line: print(line, file=stream, flush=True), interval)
