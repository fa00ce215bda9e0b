"""Figures of both methods' report pages: matplotlib's Agg canvas to a base64 PNG, and data
text made safe for a plot.

No pyplot global state, no network. Text from data goes through :func:`plot_text`: ``$`` is
escaped so a model name cannot switch matplotlib into mathtext, and long names are cut.
"""

from __future__ import annotations

import base64
import functools
import io
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image  # matplotlib's own dependency

_PLOT_TEXT_LIMIT = 40
_ASIDE_TIMEOUT_S = 300.0  # a child that has not answered by then is killed and its figures drawn here


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
    bbox = fig.get_tightbbox(canvas.get_renderer()).padded(0.1)
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


def _draw_jobs(send: Any, jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    """The child's body: the jobs drawn as the parent would draw them, sent back (None: they failed)."""
    try:
        results: Any = _draw_here(jobs)
    except BaseException:  # noqa: BLE001 - the parent draws them itself and raises there
        results = None
    send.send(results)
    send.close()


def drawn_aside(jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> Callable[[], list[Any]]:
    """Start drawing ``jobs`` (function, arguments) in a forked child process, so that a second core
    draws them while this one builds the rest of the page; returns a function that waits for their
    results, in order. The same calls give the same images wherever they run. Drawn by that
    function here instead where fork is not available (not Linux), on one core, or when the child
    fails or does not answer within ``_ASIDE_TIMEOUT_S``."""
    here = functools.partial(_draw_here, jobs)
    if not jobs or not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2:
        return here
    for stream in (sys.stdout, sys.stderr):  # else the child would write the parent's buffered output again
        if stream is not None:
            stream.flush()
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_draw_jobs, args=(send, jobs), daemon=True)
    try:
        child.start()
    except Exception:  # noqa: BLE001 - no process to spare (or a daemonic process): draw them here
        receive.close()
        send.close()
        return here
    send.close()
    return functools.partial(_figures_drawn_aside, receive, child, jobs)


def _draw_here(jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
    return [draw(*args) for draw, args in jobs]


def _figures_drawn_aside(receive: Any, child: Any, jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
    """The child's results (waited for), or the jobs drawn here when it failed."""
    try:
        drawn = receive.recv() if receive.poll(_ASIDE_TIMEOUT_S) else None
    except (EOFError, OSError):  # the child died before it answered
        drawn = None
    finally:
        receive.close()
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()
    return drawn if drawn is not None else _draw_here(jobs)
