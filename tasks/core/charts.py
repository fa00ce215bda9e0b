"""Charts of both methods' report pages: Vega-Lite specs, plain dicts, drawn by the reader's browser.

A chart is a ``<div>`` and a short ``<script>`` that hands its spec, data inlined, to ``vegaEmbed``;
the Vega, Vega-Lite and vega-embed JavaScript (from ``vl-convert-python``) is inlined once in
the page's ``<head>`` (:func:`head_script`), so the file draws its charts offline. Specs are
built as dicts, never validated by a schema library: a report's own CPU stays well under a second.

Text from data stays data: each spec is JSON with every ``<`` escaped, so a model name cannot end
the script it sits in. Floats are rounded to what a reader can see (4 decimals), NaN becomes null.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import platformdirs

from refusalbench.tasks.core.html_page import escape

SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"
_DIGITS = 4  # rates are shown to a tenth of a percent: 4 decimals hold every shown digit
_MARK = 'class="vl-chart"'  # how a page tells that it holds a chart
_CALL = re.compile(
    r'<div class="vl-chart"[^>]*></div><script>vegaEmbed\(document\.currentScript\.previousElementSibling,'
)
# Colour-blind-safe first (Okabe-Ito), then Tableau's 20: one colour per model of a page, up to 28.
PALETTE = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#cc79a7",
    "#56b4e9",
    "#d55e00",
    "#f0e442",
    "#000000",
    *("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896"),
    *("#9467bd", "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7"),
    *("#bcbd22", "#dbdb8d", "#17becf", "#9edae5"),
)


def ordered(values: Sequence[str], preferred: Sequence[str]) -> list[str]:
    """The distinct ``values``: those in ``preferred`` first, in its order, then the rest sorted."""
    present = list(dict.fromkeys(values))
    return [v for v in preferred if v in present] + sorted(v for v in present if v not in preferred)


def compact(value: Any) -> Any:
    """A value as a chart's data holds it: floats rounded to what is shown, NaN and infinities null,
    numpy and pandas scalars as plain Python, nested lists and dicts likewise."""
    if isinstance(value, Mapping):
        return {str(k): compact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    if hasattr(value, "item") and not isinstance(value, (int, float)):  # a numpy scalar
        return compact(value.item())
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        rounded = round(value, _DIGITS)
        return int(rounded) if rounded.is_integer() else rounded
    try:
        if value != value:  # pandas NA and NaT are not equal to themselves
            return None
    except (TypeError, ValueError):  # pd.NA raises on bool()
        return None
    return str(value)


def rows(frame: Any, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """A DataFrame's rows (``columns`` only, if given) as compact records."""
    part = frame if columns is None else frame[list(columns)]
    return [compact(record) for record in part.to_dict(orient="records")]


def model_colours(models: Sequence[str]) -> dict[str, Any]:
    """A colour scale giving each model the same colour on every chart of a page: by its place among
    ``models`` sorted (pass the page's models, not a chart's)."""
    names = sorted(dict.fromkeys(str(m) for m in models))
    return {"domain": names, "range": [PALETTE[i % len(PALETTE)] for i in range(len(names))]}


def too_few(values: Sequence[Any], noun: str, title: str) -> str | None:
    """The note that stands for a chart of fewer than two ``noun``s (``title`` names it); None when
    there are enough to compare."""
    distinct = len(dict.fromkeys(values))
    if distinct >= 2:
        return None
    return note(f"{title}: left out: {'only one' if distinct else 'no'} {noun}")


def or_note(html: str | None, alt: str) -> str:
    """The chart, or a note saying there was not enough data for it."""
    return html or note(f"Not enough data for: {alt}")


def note(text: str) -> str:
    """One line of the page standing for a chart it does not draw."""
    return f'<p class="note">{escape(text.rstrip("."))}.</p>'


def _json(spec: Mapping[str, Any]) -> str:
    text = json.dumps(spec, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # Inside a <script>, "</script>" and "<!--" end or bend it: no "<" reaches the page as itself.
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def chart(spec: Mapping[str, Any], data: Sequence[Mapping[str, Any]] | None, alt: str) -> str:
    """The HTML of one chart: ``spec`` (a Vega-Lite dict) with ``data`` inlined as its values; ``alt``
    describes it to a reader without the picture."""
    full: dict[str, Any] = {"$schema": SCHEMA, "description": alt, **spec}  # vega-embed's aria-label
    if data is not None:
        full["data"] = {"values": [compact(dict(row)) for row in data]}
    full.setdefault("config", {"view": {"stroke": None}, "axis": {"labelLimit": 220}})
    return (
        f'<div {_MARK} role="img" aria-label="{escape(alt)}"></div>'
        f"<script>vegaEmbed(document.currentScript.previousElementSibling,{_json(full)},{{actions:false}})</script>"
    )


def specs_in(page: str) -> list[dict[str, Any]]:
    """Every chart's spec in ``page``, in order (what :func:`chart` wrote, read back)."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(page, found.end())[0] for found in _CALL.finditer(page)]


def has_chart(html: str) -> bool:
    return _MARK in html


def _cache_dir() -> Path:
    home = os.environ.get("REFUSALBENCH_HOME")
    return Path(home) / "cache" if home else Path(platformdirs.user_cache_dir("refusalbench"))


@functools.cache
def javascript_bundle() -> str:
    """Vega, Vega-Lite and vega-embed in one script that sets ``window.vegaEmbed``: built by
    ``vl-convert`` once per version (~1.6 s) and kept in the user's cache folder (written whole or
    not at all, so a report never reads half a file)."""
    release = version("vl-convert-python")
    path = _cache_dir() / f"vega-bundle-{release}.js"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        pass
    import vl_convert  # only when the cache misses: it brings a JavaScript runtime

    # The stub marks ``snippet`` required; the library defaults it to none (a bundle that only defines vegaEmbed).
    bundle: str = vl_convert.javascript_bundle()  # type: ignore[call-arg]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".part")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(bundle)
        os.replace(temporary, path)
    except OSError:  # a read-only cache folder: the bundle is built again next time
        pass
    return bundle


def head_script(body: str) -> str:
    """The ``<script>`` a page's ``<head>`` needs for the charts in ``body``: empty when it has none."""
    if not has_chart(body):
        return ""
    # In case a later bundle holds "</script" in a string: "<\/" is the same string to JavaScript.
    bundle = javascript_bundle().replace("</script", "<\\/script")
    return f"<script>{bundle}</script>"


# ---------------------------------------------------------------- pieces of specs


def field(name: str, kind: str = "nominal", title: str | None = None, **more: Any) -> dict[str, Any]:
    """One encoding channel: a data field, its type (nominal, ordinal, quantitative) and title."""
    channel: dict[str, Any] = {"field": name, "type": kind, **more}
    if title is not None:
        channel["title"] = title
    return channel


def percent(name: str, title: str | None = None, **more: Any) -> dict[str, Any]:
    """A quantitative field shown as a percentage (a tooltip or an axis)."""
    return field(name, "quantitative", title, format=".1%", **more)


def count(name: str = "n", title: str = "n") -> dict[str, Any]:
    return field(name, "quantitative", title, format=",d")


def titled(text: str, subtitle: str | None = None) -> dict[str, Any]:
    return {"text": text, "anchor": "start", **({"subtitle": subtitle} if subtitle else {})}


def facetted(
    inner: Mapping[str, Any], by: str, *, order: Sequence[str] | None = None, columns: int = 5, title: Any = None
) -> dict[str, Any]:
    """``inner`` drawn once per value of ``by`` (small multiples), ``columns`` to a row."""
    spec: dict[str, Any] = {
        "facet": field(by, "nominal", "", **({"sort": list(order)} if order is not None else {})),
        "columns": columns,
        "spec": dict(inner),
    }
    if title is not None:
        spec["title"] = title
    return spec


def heatmap(
    *,
    x: str,
    y: str,
    value: str,
    legend: str,
    scheme: str,
    tooltip: list[dict[str, Any]],
    x_title: str | None = None,
    y_title: str | None = None,
    x_order: Sequence[str] | None = None,
    y_order: Sequence[str] | None = None,
    domain: tuple[float, float] = (0.0, 1.0),
    text: Mapping[str, Any] | None = None,
    cell: int = 34,
) -> dict[str, Any]:
    """A matrix of cells coloured by ``value`` (null: no cell), each with its ``text`` if given."""
    encoding = {
        "x": field(x, "ordinal", x_title, **({"sort": list(x_order)} if x_order is not None else {})),
        "y": field(y, "ordinal", y_title, **({"sort": list(y_order)} if y_order is not None else {})),
        "tooltip": tooltip,
    }
    colour = field(value, "quantitative", legend, scale={"scheme": scheme, "domain": list(domain)})
    layers: list[dict[str, Any]] = [{"mark": "rect", "encoding": {"color": colour}}]
    if text is not None:
        layers.append(
            {
                "transform": [{"filter": f"isValid(datum[{json.dumps(value)}])"}],
                "mark": {"type": "text", "fontSize": 9},
                "encoding": {"text": dict(text)},
            }
        )
    return {"width": {"step": cell}, "height": {"step": max(18, cell * 2 // 3)}, "encoding": encoding, "layer": layers}
