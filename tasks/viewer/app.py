"""The viewer's routes (FastAPI): HTML pages and their JSON twins, every one a GET (the viewer only reads).

| route | what |
|---|---|
| ``/`` | each run's leaderboard and first items |
| ``/runs/{run}/items?class=&intensity=&lever=&model=&outcome=&source=&domain=&disagree=1&q=&page=`` | the item table |
| ``/runs/{run}/items/{item_id}`` | one item (KnowOrNot: one experiment) |
| ``/compare?a=&b=`` | two RefusalBench runs side by side |
| ``/contamination`` | the contamination check (static vs fresh) of the runs served, where there is one |
| ``/paper`` | every figure the paper reports for its own runs, with its source |
| ``/api/runs``, ``/api/runs/{run}/items``, ``/api/runs/{run}/items/{item_id}``, ``/api/compare``, ``/api/contamination``, ``/api/paper`` | the same as JSON |
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from refusalbench.tasks.viewer import contamination_view, item_page, knowornot_pages, pages, paper_pages
from refusalbench.tasks.viewer.compare import compare_runs
from refusalbench.tasks.viewer.data import ItemQuery, RefusalBenchRun, load_run
from refusalbench.tasks.viewer.folders import RunFolder
from refusalbench.tasks.viewer.knowornot_data import KnowOrNotRun, load_knowornot
from refusalbench.tasks.viewer.layout import esc, page

Run = RefusalBenchRun | KnowOrNotRun


def load_runs(folders: Sequence[RunFolder]) -> dict[str, Run]:
    """Every folder's tables, read once (the app answers from memory afterwards)."""
    runs: dict[str, Run] = {}
    for folder in folders:
        loader = load_knowornot if folder.method == "knowornot" else load_run
        runs[folder.name] = loader(folder.name, folder.store)
    return runs


def _clean(value: Any) -> Any:
    """JSON has no NaN: undefined numbers become null."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _clean(value.item())
    return value


def _json(value: Any, status: int = 200) -> Response:
    return Response(json.dumps(_clean(value), default=str), status_code=status, media_type="application/json")


def create_app(runs: dict[str, Run]) -> FastAPI:
    """The app over ``runs`` (name -> loaded run)."""
    app = FastAPI(title="refusalbench view", docs_url=None, redoc_url=None, openapi_url=None)
    bar = [(name, "knowornot" if isinstance(run, KnowOrNotRun) else "refusalbench") for name, run in runs.items()]
    scored = [name for name, run in runs.items() if isinstance(run, RefusalBenchRun)]
    found = contamination_view.documents({name: run.uri for name, run in runs.items() if name in scored})

    def html(title: str, body: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(page(title, body, bar, compare=len(scored) > 1), status_code=status)

    def missing(what: str) -> HTMLResponse:
        return html("not found", f"<h1>Not found</h1><p>{esc(what)}</p>", 404)

    @app.get("/", response_class=HTMLResponse)
    def home() -> HTMLResponse:
        sections = [
            pages.home_section(run) if isinstance(run, RefusalBenchRun) else knowornot_pages.home_section(run)
            for run in runs.values()
        ]
        return html("runs", contamination_view.home_link(found) + "".join(sections))

    @app.get(contamination_view.PATH, response_class=HTMLResponse)
    def contamination() -> HTMLResponse:
        return html("contamination", contamination_view.body(found))

    @app.get("/runs/{run_name}/items", response_class=HTMLResponse)
    def items(run_name: str, request: Request) -> HTMLResponse:
        run = runs.get(run_name)
        if run is None:
            return missing(f"no run named {run_name}")
        params = dict(request.query_params)
        if isinstance(run, KnowOrNotRun):
            return html(f"{run_name}: experiments", knowornot_pages.experiments_body(run, params))
        return html(f"{run_name}: items", pages.items_page_body(run, ItemQuery.from_params(params)))

    @app.get("/runs/{run_name}/items/{item_id:path}", response_class=HTMLResponse)
    def item(run_name: str, item_id: str) -> HTMLResponse:
        run = runs.get(run_name)
        if run is None:
            return missing(f"no run named {run_name}")
        if isinstance(run, KnowOrNotRun):
            experiment = run.experiment(item_id)
            if experiment is None:
                return missing(f"no experiment {item_id} in {run_name}")
            return html(str(experiment["row"].get("question")), knowornot_pages.experiment_body(run, experiment))
        detail = run.item(item_id)
        if detail is None:
            return missing(f"no item {item_id} in {run_name}")
        return html(str(detail["item"].get("question") or item_id), item_page.item_body(run_name, detail))

    @app.get("/compare", response_class=HTMLResponse)
    def compare(a: str = "", b: str = "") -> HTMLResponse:
        if not a and not b and len(scored) >= 2:
            a, b = scored[0], scored[1]
        body = "<h1>Compare two runs</h1>" + pages.compare_form(scored, a, b)
        first, second = runs.get(a), runs.get(b)
        if isinstance(first, RefusalBenchRun) and isinstance(second, RefusalBenchRun):
            body += pages.compare_body(compare_runs(first, second))
        elif a or b:
            body += '<p class="muted">Choose two RefusalBench runs.</p>'
        return html("compare", body)

    @app.get(paper_pages.PATH, response_class=HTMLResponse)
    def paper() -> HTMLResponse:
        return html("as reported in the paper", paper_pages.reference_body())

    # ------------------------------------------------------------ JSON

    @app.get("/api" + paper_pages.PATH)
    def api_paper() -> Response:
        return _json(paper_pages.reference_rows())

    @app.get("/api/runs")
    def api_runs() -> Response:
        return _json([{"name": name, "method": method, "uri": runs[name].uri} for name, method in bar])

    @app.get("/api/runs/{run_name}/items")
    def api_items(run_name: str, request: Request) -> Response:
        run = runs.get(run_name)
        if run is None:
            return _json({"error": f"no run named {run_name}"}, 404)
        params = dict(request.query_params)
        if isinstance(run, KnowOrNotRun):
            return _json(run.query(params))
        return _json(run.query(ItemQuery.from_params(params)).as_json())

    @app.get("/api/runs/{run_name}/items/{item_id:path}")
    def api_item(run_name: str, item_id: str) -> Response:
        run = runs.get(run_name)
        found = (
            None if run is None else (run.experiment(item_id) if isinstance(run, KnowOrNotRun) else run.item(item_id))
        )
        if found is None:
            return _json({"error": f"no item {item_id} in {run_name}"}, 404)
        return _json(found)

    @app.get("/api/contamination")
    def api_contamination() -> Response:
        return _json(found)

    @app.get("/api/compare")
    def api_compare(a: str, b: str) -> Response:
        first, second = runs.get(a), runs.get(b)
        if not isinstance(first, RefusalBenchRun) or not isinstance(second, RefusalBenchRun):
            return _json({"error": "a and b must name two RefusalBench runs"}, 404)
        return _json(vars(compare_runs(first, second)))

    return app
