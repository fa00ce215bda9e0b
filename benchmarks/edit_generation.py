"""Edit-style vs full-rewrite generation: output tokens and candidates kept; prints a markdown table.

    python benchmarks/edit_generation.py [scripted] [local] [--single N] [--multi N] [--models NAME ...]
                                         [--cache PATH]

The same assignments are generated twice per generator, once as a full rewrite (today's
``generator_*.j2``) and once in edit style (``generator_*_edit.j2``, ``generation.edit_style``),
through the gateway as a run sends them. Per style and variant it prints the candidates, how many
are well-formed (status ok), how many pass the pre-checks (what would go on to the verifiers;
the verifiers themselves are not run), the failures (edits that did not apply; other parse or
call errors) and the output tokens per candidate (mean) and in all.

- ``scripted``: the scripted server's generator (``scripted_generator_responder``: the same change
  written as a full rewrite or as edits, so the candidates are identical); every stratum on a few
  base items; tokens are the server's whitespace-separated words.
- ``local``: the local llama.cpp models (weights pulled, as ``refusalbench run`` uses them), one
  lever per base item drawn by seed across the strata; tokens are llama.cpp's. Slow on a
  CPU: each call takes seconds to minutes, so keep the item counts small. ``--cache`` keeps the
  replies, so a re-run sends nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refusalbench.tasks.core.config import ModelConfig, load_config, packaged_config  # noqa: E402
from refusalbench.tasks.core.config_sections import EDIT_STYLE_TEMPLATES  # noqa: E402
from refusalbench.tasks.llm.callcache import SQLiteCache  # noqa: E402
from refusalbench.tasks.llm.gateway import Gateway  # noqa: E402
from refusalbench.tasks.refusalbench.basesets import load_base_set  # noqa: E402
from refusalbench.tasks.refusalbench.levers import load_catalogue  # noqa: E402
from refusalbench.tasks.refusalbench.schema.records import Assignment, BaseItem, Candidate, Lever  # noqa: E402
from refusalbench.tasks.refusalbench.stages.assign import _rng, assign_levers  # noqa: E402
from refusalbench.tasks.refusalbench.stages.edits import EDIT_FAILURE  # noqa: E402
from refusalbench.tasks.refusalbench.stages.generate import generate_candidates  # noqa: E402
from refusalbench.tasks.refusalbench.stages.prechecks import apply_prechecks, awaits_verification  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STYLES = {"full": frozenset(), "edit": frozenset(EDIT_STYLE_TEMPLATES)}
DEFAULT_LOCAL = ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"]  # the demo's generators


def base_items(single: int, multi: int) -> list[BaseItem]:
    return (
        load_base_set(ROOT / "data/sample_single.jsonl")[:single]
        + load_base_set(ROOT / "data/sample_multi.jsonl")[:multi]
    )


def one_lever_each(items: list[BaseItem], levers: list[Lever], seed: int = 0) -> list[Assignment]:
    """One assignment per item, its stratum rotating over the 18 by seed (few calls, every kind of lever)."""
    every = assign_levers(items, levers, seed=seed)
    per_item = len(every) // len(items)
    offset = _rng(seed, "edit-benchmark").randrange(per_item)
    return [every[i * per_item + (offset + 7 * i) % per_item] for i in range(len(items))]


def summarise(candidates: list[Candidate]) -> dict[str, Any]:
    tokens = [c.completion_tokens or 0 for c in candidates]
    return {
        "candidates": len(candidates),
        "well_formed": sum(c.status == "ok" for c in candidates),
        "kept": sum(awaits_verification(c) for c in candidates),
        "edit_failures": sum((c.error or "").startswith(EDIT_FAILURE) for c in candidates),
        "other_failures": sum(c.status != "ok" and not (c.error or "").startswith(EDIT_FAILURE) for c in candidates),
        "tokens_total": sum(tokens),
        "tokens_mean": sum(tokens) / len(tokens) if tokens else float("nan"),
        "prompt_mean": sum(c.prompt_tokens or 0 for c in candidates) / len(candidates) if candidates else float("nan"),
    }


def measure(
    gateway: Gateway,
    generator: str,
    assignments: list[Assignment],
    items: list[BaseItem],
    levers: dict[str, Lever],
    backend: str,
    one_by_one: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, list[Candidate]]]:
    """Both styles on ``assignments``; ``one_by_one``: each assignment in both styles before the next
    (slow local models: a stopped run still has paired figures, and the cache keeps every reply)."""
    by_id = {item.id: item for item in items}
    made: dict[str, list[Candidate]] = {style: [] for style in STYLES}
    wall = dict.fromkeys(STYLES, 0.0)
    for batch in [[a] for a in assignments] if one_by_one else [assignments]:
        for style, templates in STYLES.items():
            started = time.perf_counter()
            got = apply_prechecks(
                generate_candidates(gateway, batch, by_id, levers, generator, edit_templates=templates), by_id, levers
            )
            wall[style] += time.perf_counter() - started
            made[style] += got
            if one_by_one:
                c = got[0]
                print(
                    f"  {style} {c.variant} {c.lever_id}: {c.status}, {c.completion_tokens} output tokens, "
                    f"{time.perf_counter() - started:.0f} s{' (cached)' if c.cached else ''}",
                    file=sys.stderr,
                    flush=True,
                )
    rows = []
    for style, candidates in made.items():
        for variant in ("single", "multi", "all"):
            chosen = [c for c in candidates if variant == "all" or c.variant == variant]
            if chosen:
                rows.append(
                    {
                        "backend": backend,
                        "generator": generator,
                        "variant": variant,
                        "style": style,
                        "wall_s": wall[style] if variant == "all" else None,
                        **summarise(chosen),
                    }
                )
    return rows, made


def failures(made: dict[str, list[Candidate]]) -> list[str]:
    """One line per failed or rejected candidate, to read what went wrong."""
    lines = []
    for style, candidates in made.items():
        for c in candidates:
            if c.status != "ok":
                lines.append(f"  {style} {c.variant} {c.lever_id}: {c.status}: {(c.error or '')[:160]}")
            elif c.precheck_failures:
                lines.append(f"  {style} {c.variant} {c.lever_id}: pre-check: {'; '.join(c.precheck_failures)[:160]}")
    return lines


def scripted(single: int, multi: int) -> list[dict[str, Any]]:
    from refusalbench.tasks.llm.scripted_replies import scripted_generator_responder
    from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

    items, catalogue = base_items(single, multi), load_catalogue()
    assignments = assign_levers(items, catalogue, seed=0)  # every stratum on every item
    with ScriptedLLMServer(responder=scripted_generator_responder) as server, tempfile.TemporaryDirectory() as folder:
        gateway = Gateway(
            {"scripted": ModelConfig(model="openai/scripted", api_base=server.url)},
            SQLiteCache(Path(folder) / "calls.sqlite"),
        )
        rows, made = measure(gateway, "scripted", assignments, items, {lv.id: lv for lv in catalogue}, "scripted")
    same = sum(
        full.model_dump(include={"question", "context", "passages", "rationale"})
        == edit.model_dump(include={"question", "context", "passages", "rationale"})
        for full, edit in zip(made["full"], made["edit"])
    )
    print(f"scripted: {same} of {len(assignments)} candidates identical in both styles", file=sys.stderr)
    return rows


def local(names: list[str], single: int, multi: int, cache: str | None, max_tokens: int | None) -> list[dict[str, Any]]:
    from refusalbench.tasks.llm.local_models import is_pulled, start_server

    models = load_config(str(packaged_config("models.yaml"))).models
    items, catalogue = base_items(single, multi), load_catalogue()
    assignments = one_lever_each(items, catalogue)
    cache_path = Path(cache) if cache else Path(tempfile.mkdtemp()) / "calls.sqlite"
    rows: list[dict[str, Any]] = []
    for name in names:
        if models.get(name) is None or models[name].local is None or not is_pulled(name, models[name].local):
            print(f"skip {name}: not a pulled local model (refusalbench models pull {name})", file=sys.stderr)
            continue
        print(f"generating with {name} ({len(assignments)} assignments x 2 styles) ...", file=sys.stderr, flush=True)
        # One attempt, however long it takes: on a loaded CPU a call can outlast the registry's timeout, and a
        # retry would start it again while llama.cpp still finishes the abandoned one.
        cfg = models[name].model_copy(update={"timeout_s": 3600.0, "max_attempts": 1})
        if max_tokens is not None:  # a lower ceiling than the registry's bounds the time a looping model takes
            cfg = cfg.model_copy(update={"params": {**cfg.params, "max_tokens": max_tokens}})
        with start_server(models, [name]) as server:
            gateway = Gateway({name: cfg}, SQLiteCache(cache_path), api_bases=server.api_bases)
            got, made = measure(
                gateway, name, assignments, items, {lv.id: lv for lv in catalogue}, "local", one_by_one=True
            )
        rows += got
        print("\n".join(failures(made)), file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| backend | generator | variant | style | candidates | well-formed | kept (pre-checks) | edit failures "
        "| other failures | output tokens / candidate | output tokens total | prompt tokens / candidate | wall s |"
    )
    lines = [head, "|" + "---|" * 4 + "---:|" * 9]
    for r in rows:
        wall = "" if r["wall_s"] is None else f"{r['wall_s']:.0f}"
        lines.append(
            f"| {r['backend']} | {r['generator']} | {r['variant']} | {r['style']} | {r['candidates']} "
            f"| {r['well_formed']} | {r['kept']} | {r['edit_failures']} | {r['other_failures']} "
            f"| {r['tokens_mean']:.1f} | {r['tokens_total']} | {r['prompt_mean']:.0f} | {wall} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("backends", nargs="*", choices=["scripted", "local"], default=["scripted", "local"])
    parser.add_argument("--single", type=int, default=None, help="single-document base items (scripted 4, local 6)")
    parser.add_argument("--multi", type=int, default=None, help="multi-document base items (scripted 2, local 2)")
    parser.add_argument("--models", nargs="*", default=DEFAULT_LOCAL, help="local generators")
    parser.add_argument("--cache", default=None, help="call cache file for the local runs (default: a fresh one)")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="the local generators' max_tokens (default: the registry's)"
    )
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    if "scripted" in args.backends:
        rows += scripted(4 if args.single is None else args.single, 2 if args.multi is None else args.multi)
    if "local" in args.backends:
        rows += local(
            args.models,
            6 if args.single is None else args.single,
            2 if args.multi is None else args.multi,
            args.cache,
            args.max_tokens,
        )
    print(markdown(rows))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
