"""Progress displays share one budget of API updates per process: many tasks at once take turns,
and each display's last update (100%) is always sent."""

from __future__ import annotations

from typing import Any

import pytest

from refusalbench.tasks.pipeline import ui


class Recorded(ui.Progress):
    """A display as in a run (``_shown``), its updates recorded instead of sent to the API."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, echo=lambda *_: None, **kwargs)
        self._shown = True
        self.sent: list[float] = []

    def _show(self, percent: float) -> None:
        self.sent.append(percent)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(ui.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(ui, "PROGRESS_UPDATES", ui.UpdateBudget(every_s=0.5))
    return now


def test_one_display_updates_every_every_s_and_at_its_end(clock: list[float]) -> None:
    progress = Recorded("answerer responds", 10, every_s=2.0)
    for _ in range(9):
        clock[0] += 1.0
        progress.advance()
    assert progress.sent == [30.0, 50.0, 70.0, 90.0]  # 2 s after it began, then every 2 s
    progress.advance()
    assert progress.sent[-1] == 100.0


def test_many_displays_take_turns_and_each_still_ends_at_100(clock: list[float]) -> None:
    displays = [Recorded(f"target-{i} responds", 20, every_s=2.0) for i in range(30)]
    for _ in range(19):
        clock[0] += 1.0
        for display in displays:
            display.advance()
    between = sum(len(d.sent) for d in displays)
    # 19 s at one update per 0.5 s for the whole process (one per display, each 2 s, would be 270).
    assert between <= 19 / 0.5 + 1
    for display in displays:
        display.advance()
        assert display.sent[-1] == 100.0
