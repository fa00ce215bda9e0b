"""Human labels: what to label, where labels are kept, two ways to label, and agreement.

- ``stratified_label_sample``: an even share of responses from every configuration.
- ``LabelStore``: JSONL, one label per line, appended and fsync'ed after every label, so
  a crash loses at most the label being typed; labelling resumes where it stopped.
- ``label_in_terminal``: a prompt loop (input/output functions injectable for tests).
- ``serve_labelling``: a one-page web form on loopback for non-technical annotators,
  standard library only.
- ``cohen_kappa``, ``fleiss_kappa``, ``agreement``, ``annotator_agreement``,
  ``evaluator_vs_human``: agreement between annotators and between evaluator and humans.
"""

from __future__ import annotations

import datetime as dt
import html
import ipaddress
import itertools
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import numpy as np
import pandas as pd
from pydantic import ValidationError

from refusalbench.tasks.errors import InputError
from refusalbench.tasks.knowornot.records import AgreementReport, EvalSpec, HumanLabel, LabelItem

# ----------------------------------------------------------------- sampling


def _allocate(capacities: list[int], n: int, rng: np.random.Generator) -> list[int]:
    """Split n as evenly as the strata allow; leftovers of small strata go to the others."""
    quotas = [0] * len(capacities)
    remaining = n
    while remaining > 0:
        open_strata = [i for i, cap in enumerate(capacities) if quotas[i] < cap]
        if not open_strata:
            break
        share, extra = divmod(remaining, len(open_strata))
        lucky = set(rng.permutation(open_strata)[:extra].tolist()) if extra else set()
        for i in open_strata:
            give = min(share + (1 if i in lucky else 0), capacities[i] - quotas[i])
            quotas[i] += give
            remaining -= give
    return quotas


def stratified_label_sample(
    df: pd.DataFrame, n: int, seed: int = 0, by: Sequence[str] = ("target", "retrieval", "prompt")
) -> pd.DataFrame:
    """``n`` rows drawn evenly across the ``by`` strata (seeded), returned in shuffled order.

    Each stratum gets ``n // strata`` rows (the remainder spread at random); a stratum with
    fewer rows gives all it has and the shortfall is shared by the others. The shuffle
    keeps annotators from seeing one configuration in a block.
    """
    if n < 0:
        raise ValueError("n must be non-negative")
    missing = [c for c in by if c not in df.columns]
    if missing:
        raise ValueError(f"sample needs columns {missing}")
    rng = np.random.default_rng(seed)
    if df.empty or n == 0:
        return df.iloc[0:0]
    groups = [positions for _, positions in sorted(df.groupby(list(by), sort=True, dropna=False).indices.items(), key=lambda kv: str(kv[0]))]
    quotas = _allocate([len(g) for g in groups], n, rng)
    chosen: list[int] = []
    for positions, quota in zip(groups, quotas):
        if quota:
            chosen.extend(rng.choice(np.asarray(positions), size=quota, replace=False).tolist())
    chosen = rng.permutation(np.asarray(chosen, dtype=int)).tolist()
    return df.iloc[chosen]


def label_items_from_frame(df: pd.DataFrame, spec: EvalSpec) -> list[LabelItem]:
    """LabelItems from rows with ``experiment_id``, ``question``, ``response`` (+ optional
    ``expected_answer``, ``context``)."""
    items = []
    for row in df.to_dict(orient="records"):

        def text(name: str) -> str | None:
            value = row.get(name)
            return None if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)

        items.append(
            LabelItem(
                item_id=str(row["experiment_id"]),
                spec=spec.name,
                outcomes=list(spec.outcomes),
                question=text("question") or "",
                response=text("response") or "",
                expected_answer=text("expected_answer"),
                context=text("context"),
            )
        )
    return items


# ----------------------------------------------------------------- storage


class LabelStore:
    """Labels as JSONL at ``path``: appended one per line and fsync'ed before returning."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def load(self) -> list[HumanLabel]:
        """All labels. A torn last line (crash mid-write) is ignored; a bad line elsewhere is an InputError."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").split("\n")
        labels: list[HumanLabel] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                labels.append(HumanLabel.model_validate_json(line))
            except ValidationError as exc:
                if number == len(lines):
                    break  # unterminated last line: a write torn by a crash
                raise InputError(str(self.path), f"not a label record: {exc.errors()[0]['msg']}", line=number) from None
        return labels

    def labelled_ids(self, annotator: str, spec: str | None = None) -> set[str]:
        return {l.item_id for l in self.load() if l.annotator == annotator and (spec is None or l.spec == spec)}

    def append(self, label: HumanLabel) -> None:
        line = label.model_dump_json() + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+b") as handle:
                size = handle.seek(0, os.SEEK_END)
                if size > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        # A torn last line was never acknowledged as saved: cut it off
                        # so it cannot become a corrupt line in the middle of the file.
                        handle.seek(0)
                        content = handle.read()
                        handle.truncate(content.rfind(b"\n") + 1)
                handle.write(line.encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _match_outcome(answer: str, outcomes: Sequence[str]) -> str | None:
    answer = answer.strip()
    if answer.isdigit() and 1 <= int(answer) <= len(outcomes):
        return outcomes[int(answer) - 1]
    for outcome in outcomes:
        if answer.lower() == outcome.lower():
            return outcome
    return None


def _pending(items: Sequence[LabelItem], store: LabelStore, annotator: str) -> list[LabelItem]:
    done = {(l.spec, l.item_id) for l in store.load() if l.annotator == annotator}
    return [item for item in items if (item.spec, item.item_id) not in done]


# ----------------------------------------------------------------- terminal


def label_in_terminal(
    items: Sequence[LabelItem],
    store_path: str | Path,
    annotator: str,
    input_fn: Callable[[str], str] = input,
    output_fn: Callable[[str], None] = print,
) -> list[HumanLabel]:
    """Ask for a label for every item this annotator has not labelled yet; return the new labels.

    Each label is saved before the next item is shown. Answer with the outcome's number or
    name; ``s`` skips the item, ``q`` (or end of input) stops.
    """
    if not annotator.strip():
        raise ValueError("annotator must not be blank")
    store = LabelStore(store_path)
    pending = _pending(items, store, annotator)
    output_fn(f"{len(items) - len(pending)} of {len(items)} already labelled by {annotator}; {len(pending)} to go.")
    new: list[HumanLabel] = []
    for position, item in enumerate(pending, start=1):
        output_fn("")
        output_fn(f"[{position}/{len(pending)}] {item.spec} · {item.item_id}")
        output_fn(f"Question: {item.question}")
        if item.context:
            output_fn(f"Context:\n{item.context}")
        if item.expected_answer:
            output_fn(f"Expected answer: {item.expected_answer}")
        output_fn(f"Response: {item.response}")
        choices = "  ".join(f"{i}) {o}" for i, o in enumerate(item.outcomes, start=1))
        while True:
            try:
                answer = input_fn(f"{choices}  s) skip  q) quit > ")
            except EOFError:
                return new
            command = answer.strip().lower()
            if command in ("q", "quit"):
                return new
            if command in ("s", "skip"):
                break
            outcome = _match_outcome(answer, item.outcomes)
            if outcome is None:
                output_fn(f"Not an option: {answer.strip()!r}. Type a number, an outcome, s or q.")
                continue
            label = HumanLabel(item_id=item.item_id, spec=item.spec, annotator=annotator, label=outcome, labelled_at=_now())
            store.append(label)
            new.append(label)
            break
    output_fn("All items labelled.")
    return new


# ----------------------------------------------------------------- web page

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Labelling · {annotator}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;line-height:1.5;color:#222}}
.box{{border:1px solid #ccc;border-radius:6px;padding:.75rem 1rem;margin:.75rem 0;white-space:pre-wrap}}
.meta{{color:#666;font-size:.9rem}} button{{font-size:1.1rem;margin:.25rem .5rem .25rem 0;padding:.5rem 1.25rem;cursor:pointer}}
h2{{font-size:1rem;margin:1rem 0 .25rem}}
</style></head><body>
<p class="meta">Annotator <b>{annotator}</b> · {done} of {total} labelled</p>
{body}
</body></html>"""


def _item_html(item: LabelItem, token: str) -> str:
    esc = html.escape
    parts = [
        f'<p class="meta">{esc(item.spec)} · {esc(item.item_id)}</p>',
        f'<h2>Question</h2><div class="box">{esc(item.question)}</div>',
    ]
    if item.context:
        parts.append(f'<details><summary>Context given to the model</summary><div class="box">{esc(item.context)}</div></details>')
    if item.expected_answer:
        parts.append(f'<h2>Expected answer</h2><div class="box">{esc(item.expected_answer)}</div>')
    parts.append(f'<h2>Model response</h2><div class="box">{esc(item.response)}</div>')
    buttons = "".join(f'<button type="submit" name="label" value="{esc(o)}">{esc(o)}</button>' for o in item.outcomes)
    parts.append(
        '<form method="post" action="/label">'
        f'<input type="hidden" name="item_id" value="{esc(item.item_id)}">'
        f'<input type="hidden" name="spec" value="{esc(item.spec)}">'
        f'<input type="hidden" name="token" value="{esc(token)}">'
        f"{buttons}</form>"
    )
    return "\n".join(parts)


@dataclass
class LabellingServer:
    """A running labelling page: open ``url`` in a browser; ``shutdown()`` stops it."""

    url: str
    httpd: ThreadingHTTPServer
    thread: threading.Thread
    store: LabelStore
    annotator: str
    saved: list[HumanLabel] = field(default_factory=list)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> LabellingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_MAX_FORM_BYTES = 16 * 1024


def serve_labelling(
    items: Sequence[LabelItem],
    store_path: str | Path,
    annotator: str,
    host: str = "127.0.0.1",
    port: int = 0,
    allow_remote: bool = False,
) -> LabellingServer:
    """Serve the labelling page in a background thread and return at once.

    GET / shows the next item this annotator has not labelled (all text HTML-escaped) with
    one button per allowed outcome; POST /label saves the label (fsync'ed) and redirects
    back. Binds to loopback unless ``allow_remote`` is set; ``port=0`` picks a free port.
    Each page carries a random per-server token that POSTs must echo, so other web pages
    open in the annotator's browser cannot submit labels.
    """
    if not annotator.strip():
        raise ValueError("annotator must not be blank")
    if not _is_loopback(host) and not allow_remote:
        raise ValueError(f"refusing to serve on {host!r}: not a loopback address (pass allow_remote=True to expose it)")
    store = LabelStore(store_path)
    by_key = {(item.spec, item.item_id): item for item in items}
    token = secrets.token_urlsafe(16)
    state: dict[str, Any] = {"saved": []}
    post_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "RefusalBenchLabeller/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep the terminal quiet
            return

        def _send(self, status: HTTPStatus, body: str, extra: Mapping[str, str] | None = None) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _page(self, body: str) -> str:
            pending = _pending(items, store, annotator)
            return _PAGE.format(
                annotator=html.escape(annotator), done=len(items) - len(pending), total=len(items), body=body
            )

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path.split("?")[0] != "/":
                self._send(HTTPStatus.NOT_FOUND, "<p>Not found.</p>")
                return
            pending = _pending(items, store, annotator)
            body = _item_html(pending[0], token) if pending else "<h1>All items labelled. Thank you!</h1>"
            self._send(HTTPStatus.OK, self._page(body))

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/label":
                self._send(HTTPStatus.NOT_FOUND, "<p>Not found.</p>")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if not 0 <= length <= _MAX_FORM_BYTES:
                self._send(HTTPStatus.BAD_REQUEST, "<p>Bad request size.</p>")
                return
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode("utf-8", "replace")).items()}
            if not secrets.compare_digest(form.get("token", ""), token):
                self._send(HTTPStatus.FORBIDDEN, "<p>Stale or foreign form: reload the page.</p>")
                return
            item = by_key.get((form.get("spec", ""), form.get("item_id", "")))
            if item is None:
                self._send(HTTPStatus.BAD_REQUEST, "<p>Unknown item.</p>")
                return
            given = form.get("label", "").strip()
            outcome = next((o for o in item.outcomes if o.lower() == given.lower()), None)
            if outcome is None:
                self._send(HTTPStatus.BAD_REQUEST, f"<p>{html.escape(given)} is not an allowed outcome.</p>")
                return
            with post_lock:  # one label per (annotator, item), even on a double click
                if item.item_id not in store.labelled_ids(annotator, item.spec):
                    label = HumanLabel(item_id=item.item_id, spec=item.spec, annotator=annotator, label=outcome, labelled_at=_now())
                    store.append(label)
                    state["saved"].append(label)
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", "/")
            self.send_header("Content-Length", "0")
            self.end_headers()

    family_server = ThreadingHTTPServer
    if ":" in host:
        import socket

        class _V6Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6

        family_server = _V6Server
    httpd = family_server((host, port), Handler)
    httpd.daemon_threads = True
    bound_host, bound_port = httpd.server_address[0], httpd.server_address[1]
    shown_host = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    thread = threading.Thread(target=httpd.serve_forever, name="labelling-server", daemon=True)
    thread.start()
    return LabellingServer(
        url=f"http://{shown_host}:{bound_port}/",
        httpd=httpd,
        thread=thread,
        store=store,
        annotator=annotator,
        saved=state["saved"],
    )


# ----------------------------------------------------------------- agreement


def cohen_kappa(a: Sequence[str], b: Sequence[str], labels: Sequence[str] | None = None) -> float:
    """Cohen's kappa of two raters over the same items: (p_o - p_e) / (1 - p_e).

    NaN when undefined (no items, or chance agreement is 1 because both raters used one
    and the same label throughout).
    """
    if len(a) != len(b):
        raise ValueError("both raters must label the same items")
    if not a:
        return float("nan")
    categories = list(labels) if labels is not None else sorted(set(a) | set(b))
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b)) / n
    p_e = sum((list(a).count(c) / n) * (list(b).count(c) / n) for c in categories)
    if np.isclose(p_e, 1.0):
        return float("nan")
    return float((p_o - p_e) / (1.0 - p_e))


def fleiss_kappa(matrix: np.ndarray | Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa from an items × categories matrix of rater counts (same raters per item, ≥ 2).

    P_i = (Σ_j n_ij² − n) / (n(n−1)); P̄ = mean P_i; p_j = Σ_i n_ij / (N n); P_e = Σ_j p_j²;
    kappa = (P̄ − P_e) / (1 − P_e), NaN when P_e = 1 (every rating in one category).
    """
    counts = np.asarray(matrix, dtype=float)
    if counts.ndim != 2 or counts.shape[0] == 0:
        raise ValueError("need a non-empty items × categories matrix")
    raters = counts.sum(axis=1)
    if not np.allclose(raters, raters[0]) or raters[0] < 2:
        raise ValueError("every item needs the same number of ratings, at least 2")
    n = raters[0]
    p_items = ((counts**2).sum(axis=1) - n) / (n * (n - 1))
    p_bar = p_items.mean()
    p_categories = counts.sum(axis=0) / (counts.shape[0] * n)
    p_e = float((p_categories**2).sum())
    if np.isclose(p_e, 1.0):
        return float("nan")
    return float((p_bar - p_e) / (1.0 - p_e))


def fleiss_matrix(ratings: Sequence[Sequence[str]], categories: Sequence[str]) -> np.ndarray:
    """Items × categories counts from one list of ratings per item."""
    index = {c: j for j, c in enumerate(categories)}
    matrix = np.zeros((len(ratings), len(categories)), dtype=int)
    for i, item in enumerate(ratings):
        for rating in item:
            matrix[i, index[rating]] += 1
    return matrix


def agreement(a: Sequence[str], b: Sequence[str], labels: Sequence[str] | None = None) -> AgreementReport:
    """Percent agreement, Cohen's kappa and confusion matrix (rows = ``a``, columns = ``b``)."""
    if len(a) != len(b):
        raise ValueError("both raters must label the same items")
    categories = list(labels) if labels is not None else sorted(set(a) | set(b))
    position = {c: i for i, c in enumerate(categories)}
    confusion = [[0] * len(categories) for _ in categories]
    for x, y in zip(a, b):
        confusion[position[x]][position[y]] += 1
    n = len(a)
    return AgreementReport(
        n=n,
        percent_agreement=(sum(x == y for x, y in zip(a, b)) / n) if n else float("nan"),
        kappa=cohen_kappa(a, b, categories),
        labels=categories,
        confusion=confusion,
    )


def _labels_by_annotator(labels: Iterable[HumanLabel], spec: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for label in labels:
        if label.spec == spec:
            out.setdefault(label.annotator, {})[label.item_id] = label.label  # the latest label wins
    return out


def annotator_agreement(labels: Iterable[HumanLabel], spec: EvalSpec) -> dict[str, Any]:
    """Pairwise Cohen's kappa on shared items, and Fleiss' kappa over items every annotator labelled."""
    by_annotator = _labels_by_annotator(labels, spec.name)
    annotators = sorted(by_annotator)
    pairwise = {}
    for x, y in itertools.combinations(annotators, 2):
        shared = sorted(set(by_annotator[x]) & set(by_annotator[y]))
        pairwise[f"{x}|{y}"] = agreement(
            [by_annotator[x][i] for i in shared], [by_annotator[y][i] for i in shared], spec.outcomes
        ).model_dump()
    common = sorted(set.intersection(*(set(v) for v in by_annotator.values()))) if len(annotators) >= 2 else []
    fleiss = (
        fleiss_kappa(fleiss_matrix([[by_annotator[a][i] for a in annotators] for i in common], spec.outcomes))
        if common
        else float("nan")
    )
    return {"annotators": annotators, "pairwise": pairwise, "fleiss_kappa": fleiss, "fleiss_items": len(common)}


def evaluator_vs_human(
    labels: Iterable[HumanLabel], evaluator_outcomes: Mapping[str, str | None], spec: EvalSpec
) -> dict[str, AgreementReport]:
    """Agreement of the evaluator with each annotator and with the human consensus.

    ``evaluator_outcomes`` maps item id -> the evaluator's outcome (None = unparsable; such
    items are skipped). Rows of each confusion matrix are the humans, columns the evaluator.
    "consensus" uses the items on which every annotator who labelled them agrees.
    """
    by_annotator = _labels_by_annotator(labels, spec.name)
    reports: dict[str, AgreementReport] = {}
    for annotator, given in sorted(by_annotator.items()):
        items = sorted(i for i in given if evaluator_outcomes.get(i) is not None)
        reports[annotator] = agreement([given[i] for i in items], [evaluator_outcomes[i] for i in items], spec.outcomes)  # type: ignore[misc]
    votes: dict[str, set[str]] = {}
    for given in by_annotator.values():
        for item_id, label in given.items():
            votes.setdefault(item_id, set()).add(label)
    agreed = sorted(i for i, v in votes.items() if len(v) == 1 and evaluator_outcomes.get(i) is not None)
    reports["consensus"] = agreement([next(iter(votes[i])) for i in agreed], [evaluator_outcomes[i] for i in agreed], spec.outcomes)  # type: ignore[misc]
    return reports
