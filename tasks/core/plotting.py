"""Figures of both methods' report pages: matplotlib's Agg canvas to a base64 PNG, and data
text made safe for a plot.

No pyplot global state, no network. Text from data goes through :func:`plot_text`: ``$`` is
escaped so a model name cannot switch matplotlib into mathtext, and long names are cut.
"""

from __future__ import annotations

import base64
import io
import multiprocessing
import os
import re
import secrets
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image  # matplotlib's own dependency

_PLOT_TEXT_LIMIT = 40
_CHILD_TIMEOUT_S = 300.0  # a child that has not answered by then is killed and its figures drawn here
_MOST_PROCESSES = 4  # drawing at once, this one included: more adds memory, not speed, at a report's size


def plot_text(text: Any) -> str:
    """Data text safe for matplotlib: no mathtext, bounded length."""
    value = str(text)
    if len(value) > _PLOT_TEXT_LIMIT:
        value = value[: _PLOT_TEXT_LIMIT - 1] + "…"
    return value.replace("$", r"\$")


def png_base64(fig: Figure) -> str:
    """The figure as a base64 PNG, cropped to what it draws, in 256 colours.

    A palette PNG (Pillow's fast octree quantiser) is a third of the size of the RGBA one for
    these plots (flat fills, text, a few colour maps) and looks the same on screen (a colour bar
    shows faint steps): the report embeds every image, so this is most of report.html's size.
    """
    canvas = FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    # The same crop as bbox_inches="tight" (0.1 in of padding), measured once here: "tight"
    # draws the whole figure a first time only to measure it.
    # matplotlib leaves FigureCanvasAgg.get_renderer unannotated.
    bbox = fig.get_tightbbox(canvas.get_renderer()).padded(0.1)  # type: ignore[no-untyped-call]
    # Stored, not deflated: this PNG is decoded right away, and deflating it was a tenth of a figure's CPU.
    fig.savefig(buffer, format="png", dpi=100, bbox_inches=bbox, pil_kwargs={"compress_level": 0})
    buffer.seek(0)
    with Image.open(buffer) as drawn:
        palette = drawn.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE)
    out = io.BytesIO()
    palette.save(out, format="png")
    return base64.b64encode(out.getvalue()).decode("ascii")


def ordered(values: Sequence[str], preferred: Sequence[str]) -> list[str]:
    """The distinct ``values``: those in ``preferred`` first, in its order, then the rest sorted."""
    present = list(dict.fromkeys(values))
    return [v for v in preferred if v in present] + sorted(v for v in present if v not in preferred)


def _taken_next(taken: Any) -> int:
    """The position of the next job no process has taken yet (a shared counter, moved on under its lock)."""
    with taken.get_lock():
        position: int = taken.value  # a multiprocessing Value of typecode "l"
        taken.value += 1
    return position


def _draw_taken(
    jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], order: Sequence[int], taken: Any, drawn: dict[int, Any]
) -> None:
    """Draw the jobs this process takes, next in ``order`` whichever process asks, into ``drawn`` by index."""
    while (position := _taken_next(taken)) < len(order):
        draw, args = jobs[order[position]]
        drawn[order[position]] = draw(*args)


def _child_draws(
    send: Any, jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], order: Sequence[int], taken: Any
) -> None:
    """A child's body: the jobs it takes, sent back by index; a job that fails is left out (drawn by the parent)."""
    drawn: dict[int, Any] = {}
    try:
        _draw_taken(jobs, order, taken, drawn)
    except BaseException:  # noqa: BLE001, S110 - the parent draws what is missing and raises there
        pass
    send.send(drawn)
    send.close()


def _cores() -> int:
    """Cores this process may run on (1 where that cannot be told, or fork is not available: not Linux)."""
    return len(os.sched_getaffinity(0)) if sys.platform.startswith("linux") else 1


def _start_child(
    context: Any, jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], order: Sequence[int], taken: Any
) -> tuple[Any, Any] | None:
    """A forked child drawing the jobs it takes (:func:`_child_draws`): (its answer's pipe, the child), or None
    when none can start (no process to spare, or this one is daemonic)."""
    for stream in (sys.stdout, sys.stderr):  # else the child would write this process's buffered output again
        if stream is not None:
            stream.flush()
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_draws, args=(send, jobs, order, taken), daemon=True)
    try:
        child.start()
    except Exception:  # noqa: BLE001 - the caller draws here what no child took
        receive.close()
        return None
    finally:
        send.close()
    return receive, child


def _stop_child(receive: Any, child: Any, wait_s: float) -> None:
    """Close the child's pipe; wait ``wait_s`` for it to end, then kill it."""
    receive.close()
    child.join(timeout=wait_s)
    if child.is_alive():
        child.kill()
        child.join()


def drawn_spread(
    jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], costs: Sequence[float] | None = None
) -> list[Any]:
    """Every job's (function, arguments) result, in order, drawn by this process and by forked children
    at once, one process per core up to ``_MOST_PROCESSES``: each process takes the next job no other
    has taken, the costliest first (``costs``: estimates, any unit), so that they finish about together
    even where the estimates are rough. The same calls give the same images wherever they run.

    Drawn here alone where fork is not available (not Linux), on one core, for one job, or when no
    child can start; the jobs a child failed on, or had not answered within ``_CHILD_TIMEOUT_S``, are
    drawn here (where a job's error is raised)."""
    order = sorted(range(len(jobs)), key=lambda i: -costs[i]) if costs else list(range(len(jobs)))
    cores = _cores()
    context = multiprocessing.get_context("fork") if cores > 1 and len(jobs) > 1 else None
    drawn: dict[int, Any] = {}
    children: list[tuple[Any, Any]] = []
    answered = False
    taken = context.Value("l", 0) if context else None
    try:
        if context is not None:
            for _ in range(min(cores, _MOST_PROCESSES, len(jobs)) - 1):
                if (started := _start_child(context, jobs, order, taken)) is None:
                    break  # no process to spare: fewer of them
                children.append(started)
        if taken is not None and children:
            _draw_taken(jobs, order, taken, drawn)
        deadline = time.monotonic() + _CHILD_TIMEOUT_S
        for receive, _ in children:
            try:
                if receive.poll(max(0.0, deadline - time.monotonic())):
                    drawn.update(receive.recv())
            except (EOFError, OSError):  # the child died before it answered
                pass
        answered = True
    finally:
        for receive, child in children:  # a job failed here: the children's figures are not needed
            _stop_child(receive, child, 5 if answered else 0)
    for index in range(len(jobs)):  # here alone, or what no child drew
        if index not in drawn:
            draw, args = jobs[index]
            drawn[index] = draw(*args)
    return [drawn[index] for index in range(len(jobs))]


class DrawnAside:
    """``draw(*args)`` drawn by a forked child while this process goes on (e.g. calls models);
    :meth:`result` waits for it. Drawn by :meth:`result` here instead where fork is not available,
    on one core (the child would take the core the calls need), or when the child fails, dies or is
    silent for ``_CHILD_TIMEOUT_S``; the same call gives the same result wherever it runs."""

    def __init__(self, draw: Callable[..., Any], *args: Any) -> None:
        self._draw, self._args = draw, args
        self._receive: Any = None
        self._child: Any = None
        self._drawn: dict[int, Any] = {}
        if _cores() < 2:
            return
        context = multiprocessing.get_context("fork")
        started = _start_child(context, [(draw, args)], [0], context.Value("l", 0))
        if started is not None:  # else drawn here when asked
            self._receive, self._child = started
            # Never asked (the run failed first): the child is stopped when this object goes.
            self._stop = weakref.finalize(self, _stop_child, *started, 0)

    def result(self) -> Any:
        drawn = self._drawn
        if self._child is not None:
            try:
                if self._receive.poll(_CHILD_TIMEOUT_S):
                    drawn.update(self._receive.recv())
            except (EOFError, OSError):  # the child died before it answered
                pass
            finally:
                self._stop.detach()
                _stop_child(self._receive, self._child, 5)
                self._child = None
        if 0 not in drawn:
            drawn[0] = self._draw(*self._args)
        return drawn[0]


class FigureSlots:
    """The figures of one page, drawn together once the page is built (:func:`drawn_spread`), so that
    every core draws a share while none waits on the page's tables.

    :meth:`add` returns a placeholder that the page holds where the figure's text goes (a base64 PNG,
    or an HTML fragment); :meth:`fill` draws every figure and puts each in its placeholder's place."""

    def __init__(self) -> None:
        self._jobs: list[tuple[Callable[..., str], tuple[Any, ...]]] = []
        self._costs: list[float] = []
        self._mark = f"\x00figure-{secrets.token_hex(6)}-"  # text no page holds otherwise

    def add(self, draw: Callable[..., str], *args: Any, cost: float = 1.0) -> str:
        """A placeholder for ``draw(*args)`` (a string); ``cost``: its drawing time against others', roughly."""
        self._jobs.append((draw, args))
        self._costs.append(cost)
        return f"{self._mark}{len(self._jobs) - 1}\x00"

    def fill(self, page: str) -> str:
        """``page`` with every placeholder replaced by its figure."""
        drawn = drawn_spread(self._jobs, self._costs)
        return re.sub(re.escape(self._mark) + r"(\d+)\x00", lambda found: drawn[int(found.group(1))], page)


def drawn_now(draw: Callable[..., str], *args: Any, cost: float = 1.0) -> str:
    """``draw(*args)`` drawn at once: :meth:`FigureSlots.add`'s signature for a figure with no page to fill."""
    del cost  # only a hint for spreading figures across processes
    return draw(*args)
