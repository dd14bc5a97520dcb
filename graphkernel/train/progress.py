"""A progress bar over `Model.train`'s steps, drawn with `rich` (the `progress` extra:
`pip install -e '.[progress]'`). Only where it helps and can be seen: training of at least
MIN_STEPS steps, stdout a terminal, rich installed. Otherwise there is no bar and no error:
rich is never a dependency of graphkernel."""
from __future__ import annotations

import sys
from typing import Any

MIN_STEPS = 50  # shorter training ends before a bar tells anything


class TrainingBar:
    """A started rich progress bar: `advance(loss)` after each step, `stop()` at the end."""

    def __init__(self, progress: Any, task: Any) -> None:
        self._progress = progress
        self._task = task

    def advance(self, epoch: int, loss: float | None) -> None:
        text = f"epoch {epoch}" + ("" if loss is None else f" loss {loss:.4f}")
        self._progress.update(self._task, advance=1, description=text)

    def stop(self) -> None:
        self._progress.stop()


def training_bar(total_steps: int) -> TrainingBar | None:
    """A bar over `total_steps` steps, or None (short training, stdout not a terminal, or rich
    not installed)."""
    stream = sys.stdout
    if total_steps < MIN_STEPS or not getattr(stream, "isatty", lambda: False)():
        return None
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
    except ImportError:
        return None
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(),
                        console=Console(file=stream), transient=False)
    task = progress.add_task("training", total=total_steps)
    progress.start()
    return TrainingBar(progress, task)
