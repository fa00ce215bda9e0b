"""A RefusalBench run folder in memory: its tables read once, the item table precomputed, queried by page.

:func:`load_run` reads what the folder holds (benchmark, judgments or judged rows, responses,
verifications, candidates, metrics.json); each missing file is simply absent. It builds the
*item table* once: one row per item with its question, class, intensity, lever, expected
behaviour and domain, and for every model its decision, its verdict (correct, wrong, not
scored) and who decided (judge or parser), plus one lowercase text per item (question,
contexts, answers and every reply) for search. A query (:class:`ItemQuery`) is then a few
vectorised comparisons over at most a few thousand rows, whatever the number of replies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.decisions import ANSWER
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.report.leaderboard import ranked_models
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.scoring.io import read_metrics_json
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY

CORRECT, WRONG, NOT_SCORED = "correct", "wrong", "not scored"
VERDICTS = (CORRECT, WRONG, NOT_SCORED)
PAGE_SIZE = 50
# The item columns the table shows and filters on, in order.
ITEM_COLUMNS = ("item_id", "base_id", "question", "perturbation_class", "intensity", "lever_id", "expected", "domain")
# The verifier's criteria, in the order the verification record declares them.
CRITERIA = (
    "lever_fidelity",
    "intensity_achieved",
    "target_compliance",
    "uncertainty_induced",
    "implementation_quality",
    "answer_constraint",
    "predicted_behaviour",
    "refusal_class_alignment",
    "strategy_compliance",
)


@dataclass(frozen=True)
class ItemQuery:
    """What the item table is filtered to; an empty field filters nothing."""

    model: str = ""
    perturbation_class: str = ""
    intensity: str = ""
    lever: str = ""
    outcome: str = ""
    decision_source: str = ""
    domain: str = ""
    disagree: bool = False
    q: str = ""
    page: int = 1
    page_size: int = PAGE_SIZE

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> ItemQuery:
        """From a URL's query parameters (``class`` for the perturbation class); bad numbers fall back."""

        def number(name: str, default: int, top: int) -> int:
            try:
                return min(max(int(params.get(name, default)), 1), top)
            except ValueError:
                return default

        return cls(
            model=params.get("model", ""),
            perturbation_class=params.get("class", ""),
            intensity=params.get("intensity", ""),
            lever=params.get("lever", ""),
            outcome=params.get("outcome", ""),
            decision_source=params.get("source", ""),
            domain=params.get("domain", ""),
            disagree=params.get("disagree", "") not in ("", "0", "false"),
            q=params.get("q", "").strip(),
            page=number("page", 1, 10**6),
            page_size=number("page_size", PAGE_SIZE, 500),
        )

    def params(self, **changes: Any) -> dict[str, str]:
        """The query as URL parameters (empty ones left out), with ``changes`` applied (e.g. ``page=2``)."""
        query = replace(self, **changes)
        pairs = {
            "model": query.model,
            "class": query.perturbation_class,
            "intensity": query.intensity,
            "lever": query.lever,
            "outcome": query.outcome,
            "source": query.decision_source,
            "domain": query.domain,
            "disagree": "1" if query.disagree else "",
            "q": query.q,
            "page": str(query.page) if query.page != 1 else "",
            "page_size": str(query.page_size) if query.page_size != PAGE_SIZE else "",
        }
        return {k: v for k, v in pairs.items() if v}


@dataclass
class ItemPage:
    """One page of the filtered item table."""

    rows: list[dict[str, Any]]
    total: int
    page: int
    pages: int
    models: list[str]

    def as_json(self) -> dict[str, Any]:
        return {"total": self.total, "page": self.page, "pages": self.pages, "models": self.models, "rows": self.rows}


@dataclass
class RefusalBenchRun:
    """One RefusalBench run folder's tables, loaded once, and the item table built from them."""

    name: str
    uri: str
    manifest: dict[str, Any] | None
    metrics: dict[str, Any] | None
    items: pd.DataFrame  # one row per item, ITEM_COLUMNS, in benchmark order
    models: list[str]
    decision: dict[str, np.ndarray]  # model -> decision per item (None where it has no row)
    verdict: dict[str, np.ndarray]  # model -> CORRECT | WRONG | NOT_SCORED | None per item
    source: dict[str, np.ndarray]  # model -> judge | parser | None per item
    disagree: np.ndarray  # models that decided this item decided differently
    search: pd.Series  # lowercase text per item
    benchmark: Keyed | None  # by item_id
    judgments: Keyed | None  # by item_id
    responses: Keyed | None  # by item_id
    verifications: Keyed | None  # by candidate_id (a benchmark item's id is its candidate's)
    candidates: Keyed | None  # by candidate_id
    row_of: dict[str, int] = field(default_factory=dict)  # item_id -> its position in ``items``
    has_source: bool = False

    # ------------------------------------------------------------ options for the filters

    def options(self) -> dict[str, list[str]]:
        """The values each filter offers (those present in the run)."""

        def values(column: str) -> list[str]:
            return sorted({str(v) for v in self.items[column].dropna() if str(v)})

        return {
            "class": values("perturbation_class"),
            "intensity": values("intensity"),
            "lever": values("lever_id"),
            "domain": values("domain"),
            "model": list(self.models),
            "outcome": list(VERDICTS),
            "source": ["judge", "parser"] if self.has_source else [],
        }

    # ------------------------------------------------------------ queries

    def query(self, query: ItemQuery) -> ItemPage:
        """The page of items ``query`` asks for: filtered, in benchmark order."""
        mask = np.ones(len(self.items), dtype=bool)
        for column, wanted in (
            ("perturbation_class", query.perturbation_class),
            ("intensity", query.intensity),
            ("lever_id", query.lever),
            ("domain", query.domain),
        ):
            if wanted:
                mask &= self.items[column].to_numpy(dtype=object) == wanted
        models = [query.model] if query.model in self.models else list(self.models)
        if query.outcome:
            mask &= np.logical_or.reduce([self.verdict[m] == query.outcome for m in models]) if models else False
        if query.decision_source:
            mask &= np.logical_or.reduce([self.source[m] == query.decision_source for m in models]) if models else False
        if query.disagree:
            mask &= self.disagree
        if query.q:
            mask &= self.search.str.contains(query.q.lower(), regex=False).to_numpy(dtype=bool)
        positions = np.flatnonzero(mask)
        total = len(positions)
        pages = max(1, math.ceil(total / query.page_size))
        page = min(query.page, pages)
        chosen = positions[(page - 1) * query.page_size : page * query.page_size]
        rows = []
        for position in chosen:
            row = {column: plain(self.items[column].iat[position]) for column in ITEM_COLUMNS}
            row["models"] = {
                m: {
                    "decision": self.decision[m][position],
                    "verdict": self.verdict[m][position],
                    "source": self.source[m][position],
                }
                for m in models
            }
            rows.append(row)
        return ItemPage(rows=rows, total=total, page=page, pages=pages, models=models)

    def item(self, item_id: str) -> dict[str, Any] | None:
        """Everything the folder says about one item; None when the run has no such item."""
        position = self.row_of.get(item_id)
        if position is None:
            return None
        detail: dict[str, Any] = {"item": {c: plain(self.items[c].iat[position]) for c in ITEM_COLUMNS}}
        if self.benchmark is not None:
            detail["item"] = _first_row(self.benchmark, item_id) or detail["item"]
        detail["lever"] = lever_info(str(detail["item"].get("lever_id") or ""))
        detail["candidate"] = _first_row(self.candidates, item_id)
        detail["verifications"] = _rows(self.verifications, item_id)
        judged = {r["model"]: r for r in _rows(self.judgments, item_id)}
        replies = {r["model"]: r for r in _rows(self.responses, item_id)}
        detail["models"] = [
            {"model": m, "verdict": self.verdict[m][position], "judgment": judged.get(m), "response": replies.get(m)}
            for m in self.models
            if m in judged or m in replies
        ]
        return detail


# ---------------------------------------------------------------- loading


def _frame(store: ArtifactStore, artifact: runfolder.Artifact) -> pd.DataFrame | None:
    return store.read_frame(artifact.name) if store.has(artifact) else None


def plain(value: Any) -> Any:
    """A cell as a JSON-safe Python value: NaN and NA as None, numpy scalars and arrays as Python's."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


@dataclass
class Keyed:
    """A table and where each key's rows are in it: an item's rows found without a scan."""

    frame: pd.DataFrame
    positions: dict[str, np.ndarray]

    @classmethod
    def of(cls, frame: pd.DataFrame | None, column: str) -> Keyed | None:
        if frame is None or column not in frame:
            return None
        positions = {str(k): v for k, v in frame.groupby(column, sort=False).indices.items()} if len(frame) else {}
        return cls(frame, positions)

    def rows(self, key: str) -> list[dict[str, Any]]:
        picked = self.positions.get(key)
        if picked is None:
            return []
        return [{c: plain(v) for c, v in row.items()} for row in self.frame.iloc[picked].to_dict(orient="records")]


def _rows(table: Keyed | None, key: str) -> list[dict[str, Any]]:
    return table.rows(key) if table is not None else []


def _first_row(table: Keyed | None, key: str) -> dict[str, Any] | None:
    rows = _rows(table, key)
    return rows[0] if rows else None


_LEVERS: dict[str, dict[str, str]] | None = None


def lever_info(lever_id: str) -> dict[str, str] | None:
    """The catalogue's name and instruction of a lever; None for one the packaged catalogue lacks."""
    global _LEVERS
    if _LEVERS is None:
        _LEVERS = {
            lever.id: {"id": lever.id, "name": lever.name, "instruction": lever.instruction, "target": lever.target}
            for lever in load_catalogue()
        }
    return _LEVERS.get(lever_id)


def row_verdicts(rows: pd.DataFrame) -> np.ndarray:
    """CORRECT, WRONG or NOT_SCORED per judged row.

    A row not scored is one whose outcome is not ``ok`` (or, before outcomes were recorded,
    one with an error). An answerable item is right when answered and graded correct; an
    unanswerable one when refused with its class's code.
    """
    outcome = rows["outcome"].astype(object) if "outcome" in rows else pd.Series(None, index=rows.index, dtype=object)
    error = rows["error"].notna() if "error" in rows else pd.Series(False, index=rows.index)
    scored = np.where(outcome.isna().to_numpy(), ~error.to_numpy(dtype=bool), (outcome == "ok").to_numpy(dtype=bool))
    decision = rows["decision"].astype(object).to_numpy()
    expected = rows["expected"].astype(object).to_numpy()
    graded = rows["answer_correct"].astype(object).to_numpy() if "answer_correct" in rows else np.full(len(rows), None)
    answerable = expected == ANSWER_CORRECTLY
    right = np.where(answerable, (decision == ANSWER) & (graded == True), decision == expected)  # noqa: E712
    return np.where(scored, np.where(right, CORRECT, WRONG), NOT_SCORED).astype(object)


def _items_from(benchmark: pd.DataFrame | None, judgments: pd.DataFrame | None) -> pd.DataFrame:
    """One row per item: the benchmark's, or (a folder with judged rows alone) the judged rows' item columns."""
    if benchmark is not None and not benchmark.empty:
        items = benchmark.drop_duplicates("item_id")
    elif judgments is not None and not judgments.empty:
        items = judgments.drop_duplicates("item_id")
    else:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in ITEM_COLUMNS})
    out = pd.DataFrame({c: items[c].astype(object) if c in items else None for c in ITEM_COLUMNS})
    return out.reset_index(drop=True)


def _passage_text(passages: Any) -> str:
    if passages is None or (isinstance(passages, float) and math.isnan(passages)):
        return ""
    return "\n".join(str(p.get("text", "")) for p in passages if isinstance(p, dict))


def _search_text(items: pd.DataFrame, benchmark: pd.DataFrame | None, responses: pd.DataFrame | None) -> pd.Series:
    """One lowercase text per item: its question, contexts and answers, and every model's reply."""
    text = items["question"].fillna("").astype(str) + "\n" + items["item_id"].astype(str)
    if benchmark is not None and not benchmark.empty:
        own = benchmark.drop_duplicates("item_id").set_index("item_id")
        parts = [
            own[c].fillna("").astype(str) for c in ("context", "original_question", "original_context") if c in own
        ]
        parts += [own[c].map(_passage_text) for c in ("passages", "original_passages") if c in own]
        if "answers" in own:
            parts.append(own["answers"].map(lambda a: " ".join(map(str, a)) if a is not None else ""))
        if parts:
            joined = parts[0].str.cat(parts[1:], sep="\n")
            text = text + "\n" + items["item_id"].map(joined).fillna("")
    if responses is not None and not responses.empty and "raw" in responses:
        replies = responses.dropna(subset=["raw"]).groupby("item_id")["raw"].agg("\n".join)
        text = text + "\n" + items["item_id"].map(replies).fillna("")
    return text.str.lower()


def _per_model(items: pd.DataFrame, rows: pd.DataFrame, values: np.ndarray, models: list[str]) -> dict[str, np.ndarray]:
    """{model: value per item} from one value per judged row (None where the model has no row)."""
    where = pd.Index(items["item_id"].astype(str)).get_indexer(rows["item_id"].astype(str).to_numpy())
    out = {}
    for model, picked in rows.groupby("model", sort=False).indices.items():
        column = np.full(len(items), None, dtype=object)
        at = where[picked]
        keep = at >= 0
        column[at[keep]] = values[picked][keep]
        out[str(model)] = column
    return {m: out.get(m, np.full(len(items), None, dtype=object)) for m in models}


def _disagreeing(decisions: list[np.ndarray], n: int) -> np.ndarray:
    """Per item: whether the models that decided it decided differently (one vectorised pass, no row loop)."""
    if not decisions:
        return np.zeros(n, dtype=bool)
    codes, _ = pd.factorize(np.concatenate(decisions), use_na_sentinel=True)  # None -> -1
    table = codes.reshape(len(decisions), n).T
    decided = table >= 0
    low = np.where(decided, table, np.iinfo(table.dtype).max).min(axis=1)
    high = np.where(decided, table, -1).max(axis=1)
    disagree: np.ndarray = decided.any(axis=1) & (low != high)
    return disagree


def _none_for_missing(values: np.ndarray) -> np.ndarray:
    """An object array with NaN and NA as None (JSON null, and one test for "no value")."""
    out = values.astype(object)
    out[pd.isna(out)] = None
    return out


def _metrics(store: ArtifactStore) -> dict[str, Any] | None:
    if not store.has(rb_files.METRICS):
        return None
    document = read_metrics_json(store.read_bytes(rb_files.METRICS.name))
    return document if document.get("models") is not None else None


def load_run(name: str, store: ArtifactStore) -> RefusalBenchRun:
    """Read a RefusalBench run folder once and build its item table."""
    manifest = store.read_json(runfolder.MANIFEST.name) if store.has(runfolder.MANIFEST) else None
    metrics = _metrics(store)
    benchmark = _frame(store, rb_files.BENCHMARK)
    judgments = _frame(store, rb_files.JUDGMENTS)
    if judgments is None:
        judgments = _frame(store, rb_files.JUDGED)
    responses = _frame(store, rb_files.RESPONSES)
    if judgments is not None:
        judgments = judgments.drop_duplicates(["item_id", "model"], keep="last").reset_index(drop=True)
    items = _items_from(benchmark, judgments)
    present = set(judgments["model"].astype(str)) if judgments is not None else set()
    if responses is not None:
        present |= set(responses["model"].astype(str))
    ranked = [m for m in ranked_models(metrics["models"]) if m in present] if metrics else []
    models = ranked + sorted(present - set(ranked))
    if judgments is not None and not judgments.empty:
        verdicts = row_verdicts(judgments)
        decision = _per_model(items, judgments, judgments["decision"].astype(object).to_numpy(), models)
        verdict = _per_model(items, judgments, verdicts, models)
        has_source = "decision_source" in judgments and judgments["decision_source"].notna().any()
        sources = (
            judgments["decision_source"].astype(object).to_numpy() if has_source else np.full(len(judgments), None)
        )
        source = _per_model(items, judgments, sources, models)
    else:  # replies without judgments: the parser's decision, nothing scored yet
        rows = responses if responses is not None else pd.DataFrame({"item_id": [], "model": [], "decision": []})
        decision = _per_model(items, rows, rows["decision"].astype(object).to_numpy(), models)
        verdict = {m: np.full(len(items), NOT_SCORED, dtype=object) for m in models}
        for m in models:
            verdict[m][pd.isna(decision[m])] = None
        source = {m: np.full(len(items), None, dtype=object) for m in models}
        has_source = False
    disagree = _disagreeing([decision[m] for m in models], len(items))
    return RefusalBenchRun(
        name=name,
        uri=store.root,
        manifest=manifest,
        metrics=metrics,
        items=items,
        models=models,
        decision={m: _none_for_missing(v) for m, v in decision.items()},
        verdict=verdict,
        source={m: _none_for_missing(v) for m, v in source.items()},
        disagree=disagree,
        search=_search_text(items, benchmark, responses),
        benchmark=Keyed.of(benchmark, "item_id"),
        judgments=Keyed.of(judgments, "item_id"),
        responses=Keyed.of(responses, "item_id"),
        verifications=Keyed.of(_frame(store, rb_files.VERIFICATIONS), "candidate_id"),
        candidates=Keyed.of(_frame(store, rb_files.CANDIDATES), "candidate_id"),
        row_of={str(k): i for i, k in enumerate(items["item_id"])},
        has_source=bool(has_source),
    )


def judge_rationale(judge_raw: str | None) -> str | None:
    """The judge's own words: the ``rationale`` of its JSON reply, or None."""
    if not judge_raw:
        return None
    try:
        reply = json.loads(judge_raw)
    except ValueError:
        return None
    rationale = reply.get("rationale") if isinstance(reply, dict) else None
    return str(rationale) if rationale else None
