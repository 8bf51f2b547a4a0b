"""The export's stages: each one logged when it starts and ends (``fastnli`` logger, INFO, with its seconds), timed
for the manifest, and, when asked, shown as a rich progress bar on stderr.

The bar is opt-in (``export(progress=True)``; ``fastnli export`` turns it on at a terminal). It draws on the console of
a :class:`rich.logging.RichHandler` already attached to the ``fastnli`` logger or the root logger when there is one,
so log lines scroll above the bar instead of through it; otherwise on a stderr console of its own. Nothing is
printed when it is off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("fastnli")


def _log_console() -> Any:
    """The console of a RichHandler on the ``fastnli`` or root logger, else a new stderr console."""
    from rich.console import Console
    from rich.logging import RichHandler

    for log in (logger, logging.getLogger()):
        for handler in log.handlers:
            if isinstance(handler, RichHandler):
                return handler.console
    return Console(stderr=True)


class Stages:
    """Runs named stages in a planned order and records their wall-clock seconds.

    Args:
        title: what the stages make, for the log lines and the bar (e.g. ``"export of microsoft/deberta-large-mnli"``).
        planned: the stage names in the order they will run (their count sets the bar's length).
        progress: show a rich progress bar on stderr (default False: log lines only).
    """

    def __init__(self, title: str, planned: Sequence[str], progress: bool = False) -> None:
        self.title = title
        self.planned = list(planned)
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}
        self._progress: Any = None
        self._task: Any = None
        if progress:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), console=_log_console(),
                                      transient=False)

    def __enter__(self) -> Stages:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=len(self.planned))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Run one planned stage: log its start, time it, log its end (or its failure) and advance the bar.

        Raises:
            ValueError: when ``name`` is not planned or already ran (the bar and the record would lie).
        """
        if name not in self.planned or name in self.seconds:
            raise ValueError(f"stage {name!r} is not planned or ran already (planned: {self.planned})")
        k = self.planned.index(name) + 1
        n = len(self.planned)
        logger.info("%s: stage %d/%d %s ...", self.title, k, n, name)
        if self._progress is not None:
            self._progress.update(self._task, description=f"{self.title}: {name}")
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        except BaseException:
            logger.info("%s: stage %d/%d %s failed after %.1f s", self.title, k, n, name, time.perf_counter() - t0)
            raise
        self.seconds[name] = time.perf_counter() - t0
        self.cpu_seconds[name] = time.process_time() - c0
        logger.info("%s: stage %d/%d %s done in %.1f s (%.1f s of CPU)", self.title, k, n, name, self.seconds[name],
                    self.cpu_seconds[name])
        if self._progress is not None:
            self._progress.advance(self._task)

    def record(self) -> list[dict[str, Any]]:
        """The stages that ran, in order: ``[{"stage": name, "seconds": wall-clock s, "cpu_seconds": s}, ...]``
        (rounded to ms). CPU seconds are this process's, all threads: on a machine shared with other work they
        measure the stage's own cost where wall-clock seconds also count the waiting."""
        return [{"stage": name, "seconds": round(self.seconds[name], 3), "cpu_seconds": round(self.cpu_seconds[name], 3)}
                for name in self.planned if name in self.seconds]
