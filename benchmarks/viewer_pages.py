"""Latency of ``refusalbench view`` on a run of the paper's largest shape: 30 models x 1,600 items.

Writes two synthetic run folders with the project's own records and store (benchmark,
candidates, verifications, responses, judgments, judged rows, metrics.json from the real
scoring, a manifest): 1,600 items, 30 targets (48,000 replies with reasoning, tokens and cost),
two verifiers; the second run is the first with ~5% of the decisions changed (a second
evaluation of the same benchmark). Then it serves both with the viewer's app on a loopback
port (uvicorn in a thread, as ``refusalbench view`` runs it) and times, over real HTTP, the home
page, item table pages (unfiltered, filtered, searched, deep pages, JSON), item pages and the
comparison: median and max of several requests each. Prints figures; asserts nothing.

    python benchmarks/viewer_pages.py                       # 30 models x 1,600 items, 7 requests each
    python benchmarks/viewer_pages.py --models 10 --items 400 --repeat 5
    python benchmarks/viewer_pages.py --keep /tmp/viewer-runs   # keep the folders (e.g. to open them yourself)
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refusalbench.tasks.core import runfolder  # noqa: E402
from refusalbench.tasks.core.runfolder import RunManifest  # noqa: E402
from refusalbench.tasks.core.store import ArtifactStore  # noqa: E402
from refusalbench.tasks.refusalbench.levers import load_catalogue  # noqa: E402
from refusalbench.tasks.refusalbench.report.run_outputs import judged_frame, write_scores  # noqa: E402
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files  # noqa: E402
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Candidate, Judgment, Response, Verification  # noqa: E402
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY  # noqa: E402

WORDS = (
    "river bridge council harbour record annual report mayor museum railway station opened "
    "engineer century archive treaty district school library festival market"
).split()
CRITERIA = (
    "lever_fidelity",
    "intensity_achieved",
    "target_compliance",
    "uncertainty_induced",
    "implementation_quality",
    "answer_constraint",
    "predicted_behaviour",
    "refusal_class_alignment",
)


def _sentence(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, size=words)).capitalize() + "."


def _items(rng: np.random.Generator, n: int) -> list[BenchmarkItem]:
    levers = load_catalogue()
    items = []
    for i in range(n):
        lever = levers[i % len(levers)]
        answer = str(1800 + int(rng.integers(0, 220)))
        original = " ".join(_sentence(rng, 14) for _ in range(4)) + f" It opened in {answer}."
        context = (
            original.replace(f"It opened in {answer}.", "Its opening year is not recorded.")
            if lever.expected != ANSWER_CORRECTLY
            else original.replace("opened", "was opened")
        )
        items.append(
            BenchmarkItem(
                item_id=f"it{i:05d}",
                base_id=f"b{i // 10:04d}",
                variant="single",
                perturbation_class=lever.perturbation_class,
                intensity=lever.intensity,
                lever_id=lever.id,
                generator=f"gen-{i % 3}",
                question=f"When did the {WORDS[i % len(WORDS)]} number {i} open?",
                context=context,
                original_question=f"When did the {WORDS[i % len(WORDS)]} number {i} open?",
                original_context=original,
                answers=[answer],
                expected=lever.expected,
                domain=("history", "science", "health", "business")[i % 4],
            )
        )
    return items


def _decision(rng: np.random.Generator, item: BenchmarkItem, skill: float) -> str:
    if rng.random() < skill:
        return "ANSWER" if item.expected == ANSWER_CORRECTLY else item.expected
    return "REFUSE_INFO_MISSING_IN_CONTEXT" if item.expected == ANSWER_CORRECTLY else "ANSWER"


def synthetic_run(folder: Path, items: list[BenchmarkItem], models: int, seed: int, flip: float = 0.0) -> None:
    """One evaluated run folder over ``items``: every model replies to every item, judged and scored."""
    rng = np.random.default_rng(seed)
    store = ArtifactStore(folder)
    responses, judgments = [], []
    for m in range(models):
        model, skill = f"model-{m:02d}", 0.55 + 0.4 * m / max(models - 1, 1)
        decision_rng = np.random.default_rng(1000 + m)  # the same decisions in every run, but the flipped ones
        for item in items:
            decision = _decision(decision_rng, item, skill)
            if flip and rng.random() < flip:
                decision = "ANSWER" if decision != "ANSWER" else "REFUSE_AMBIGUOUS_QUERY"
            reply = (
                f"The record says it opened in {item.answers[0]}. " + _sentence(rng, 30)
                if decision == "ANSWER"
                else f"{decision}. " + _sentence(rng, 40)
            )
            tokens = int(rng.integers(300, 900))
            responses.append(
                Response(
                    item_id=item.item_id,
                    model=model,
                    raw=reply,
                    decision=decision,
                    latency_s=0.8,
                    prompt_tokens=tokens,
                    completion_tokens=80,
                    cost_usd=tokens * 2e-7,
                    outcome="ok",
                    finish_reason="stop",
                    reasoning=_sentence(rng, 25) if m % 3 == 0 else None,
                )
            )
            correct = decision == "ANSWER" and item.expected == ANSWER_CORRECTLY and rng.random() < 0.9
            judgments.append(
                Judgment(
                    item_id=item.item_id,
                    model=model,
                    expected=item.expected,
                    decision=decision,
                    parser_decision=decision,
                    decision_source="judge",
                    answer_correct=(correct if decision == "ANSWER" else False)
                    if item.expected == ANSWER_CORRECTLY
                    else (False if decision == "ANSWER" else None),
                    refusal_correct=None if item.expected == ANSWER_CORRECTLY else decision == item.expected,
                    quality=(5 if correct else 2) if decision == "ANSWER" else None,
                    judge="judge",
                    outcome="ok",
                    perturbation_class=item.perturbation_class,
                    intensity=item.intensity,
                    lever_id=item.lever_id,
                    domain=item.domain,
                    generator=item.generator,
                    judge_raw=json.dumps(
                        {
                            "classification": decision,
                            "quality": 5 if correct else 2,
                            "rationale": "The reply " + ("matches" if correct else "misses") + " the reference.",
                        }
                    ),
                )
            )
    store.save(rb_files.BENCHMARK, items)
    store.save(
        rb_files.CANDIDATES,
        [
            Candidate(
                candidate_id=i.item_id,
                assignment_id=f"a-{i.item_id}",
                base_id=i.base_id,
                lever_id=i.lever_id,
                perturbation_class=i.perturbation_class,
                intensity=i.intensity,
                variant="single",
                generator=i.generator,
                status="ok",
                question=i.question,
                context=i.context,
                rationale="Removed the year.",
                precheck_failures=[],
                expected=i.expected,
                prompt_hash="x",
            )
            for i in items
        ],
    )
    store.save(
        rb_files.VERIFICATIONS,
        [
            Verification(
                candidate_id=i.item_id,
                generator=i.generator,
                verifier=v,
                verdict="PASS",
                stated_verdict="PASS",
                consistent=True,
                **dict.fromkeys(CRITERIA, True),
            )
            for i in items
            for v in ("ver-a", "ver-b")
        ],
    )
    store.save(rb_files.RESPONSES, responses)
    store.save(rb_files.JUDGMENTS, judgments)
    frame, _ = judged_frame(judgments, items)
    store.save(rb_files.JUDGED, frame)
    write_scores(store, frame, bootstrap=200, seed=seed)
    store.save(
        runfolder.MANIFEST,
        RunManifest(
            schema_version=runfolder.SCHEMA_VERSION,
            run_id=f"synthetic{seed}",
            kind="evaluate",
            created_at="2025-01-01T00:00:00Z",
            package_version="-",
            config_hash="-",
            status="completed",
        ),
    )


def _serve(runs: list[str]) -> tuple[str, float]:
    """The viewer over ``runs`` in a thread on a free loopback port: its URL, and the seconds loading took."""
    import uvicorn

    from refusalbench.tasks.viewer.app import create_app, load_runs
    from refusalbench.tasks.viewer.folders import open_folders

    started = time.perf_counter()
    app = create_app(load_runs(open_folders(runs)))
    loaded = time.perf_counter() - started
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=30)
    parser.add_argument("--items", type=int, default=1600)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--keep", type=Path, help="write the run folders here and keep them")
    args = parser.parse_args()
    import httpx

    root = args.keep or Path(tempfile.mkdtemp(prefix="viewer-bench-"))
    first, second = root / "round-1", root / "round-2"
    started = time.perf_counter()
    items = _items(np.random.default_rng(0), args.items)
    if not (first / "metrics.json").exists():
        synthetic_run(first, items, args.models, seed=1)
    if not (second / "metrics.json").exists():
        synthetic_run(second, items, args.models, seed=2, flip=0.05)
    print(
        f"run folders: {root} ({args.models} models x {args.items} items = {args.models * args.items} replies each, "
        f"unless kept from an earlier run; {time.perf_counter() - started:.1f} s to write)"
    )
    base, loaded = _serve([str(first), str(second)])
    print(f"loaded both in {loaded:.2f} s; serving {base}\n")
    ids = ArtifactStore(first).read_table(rb_files.BENCHMARK.name).column("item_id").to_pylist()  # a kept folder's own
    some = [ids[i] for i in np.linspace(0, len(ids) - 1, args.repeat).astype(int)]
    cases = {
        "home page": ["/"],
        "items, page 1": ["/runs/round-1/items"],
        "items, page 20": ["/runs/round-1/items?page=20"],
        "items, class + intensity": ["/runs/round-1/items?class=P-MissingInfo&intensity=HIGH"],
        "items, model + wrong": ["/runs/round-1/items?model=model-05&outcome=wrong"],
        "items, models disagree": ["/runs/round-1/items?disagree=1&page=3"],
        "items, search a word": ["/runs/round-1/items?q=harbour"],
        "items, search + filter": ["/runs/round-1/items?q=number+17&class=P-Ambiguity"],
        "items JSON, page 5": ["/api/runs/round-1/items?page=5"],
        "item page": [f"/runs/round-1/items/{i}" for i in some],
        "item JSON": [f"/api/runs/round-1/items/{i}" for i in some],
        "compare": ["/compare?a=round-1&b=round-2"],
    }
    print("| page | median ms | max ms | requests | bytes |\n|---|---:|---:|---:|---:|")
    with httpx.Client(base_url=base, timeout=60) as client:
        for name, paths in cases.items():
            seconds, size = [], 0
            for n in range(args.repeat):
                path = paths[n % len(paths)]
                begin = time.perf_counter()
                reply = client.get(path)
                seconds.append(time.perf_counter() - begin)
                reply.raise_for_status()
                size = len(reply.content)
            print(
                f"| {name} | {1000 * statistics.median(seconds):.0f} | {1000 * max(seconds):.0f} | {len(seconds)} "
                f"| {size:,} |"
            )


if __name__ == "__main__":
    main()
