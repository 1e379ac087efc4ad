"""Progress bars for long verbs (rich, on a TTY only)."""

from __future__ import annotations

__all__ = ["ProgressBar", "SearchProgress"]


class ProgressBar:
    """``with ProgressBar("baseline") as bar: ... bar.update(done, total, result)``."""

    def __init__(self, label: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"),
            transient=False,
        )
        self._label = label
        self._task = None

    def __enter__(self) -> "ProgressBar":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._progress.__exit__(*exc)
        return False

    def update(self, done: int, total: int, result=None) -> None:
        if self._task is None:
            self._task = self._progress.add_task(self._label, total=total, last="")
        last = ""
        if result is not None:
            last = result.status + (f" {result.step_time_s * 1e3:.1f} ms" if result.step_time_s else "")
        self._progress.update(self._task, completed=done, total=total, last=last)

    def update_text(self, label: str, done: int, total: int, last: str = "") -> None:
        """Like :meth:`update`, with the label and the last-result text given as they are."""
        if self._task is None:
            self._task = self._progress.add_task(label, total=total, last="")
        self._progress.update(self._task, description=label, completed=done, total=total, last=last)


class SearchProgress:
    """One bar over a search's budget, with its phase (explore, promote) and the last result."""

    def __init__(self) -> None:
        self._bar = ProgressBar("search")

    def __enter__(self) -> "SearchProgress":
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        return self._bar.__exit__(*exc)

    def update(self, phase: str, done: int, total: int, last: str = "") -> None:
        self._bar.update_text(f"search: {phase}", done, total, last)
