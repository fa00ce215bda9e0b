"""Figures of both methods' report pages: matplotlib's Agg canvas to a base64 PNG, and data
text made safe for a plot.

No pyplot global state, no network. Text from data goes through :func:`plot_text`: ``$`` is
escaped so a model name cannot switch matplotlib into mathtext, and long names are cut.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image  # matplotlib's own dependency

_PLOT_TEXT_LIMIT = 40


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
    fig.savefig(buffer, format="png", dpi=100, bbox_inches=bbox)
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
