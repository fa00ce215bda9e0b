"""Speed of the local llama.cpp models on this machine; prints a markdown table.

    python benchmarks/local_models.py [NAME ...] [--repeats N]

For each local model of configs/models.yaml (or the names given), with weights already pulled
(`refusalbench models pull NAME`): model load time (in-process), server start time, prompt
processing and decode speed, and seconds per call for three prompt shapes like the pipeline's:
a target answering from a context, a verifier returning a small JSON verdict, and a generator
returning a JSON perturbation. Every call goes over HTTP to the same server `refusalbench run`
starts, with the JSON shapes constrained by a JSON schema as the gateway requests them.
The prompts are plain strings shaped like the real templates, not the templates themselves.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from refusalbench.tasks.core.config import ModelConfig, load_config, packaged_config  # noqa: E402
from refusalbench.tasks.llm.local_models import is_pulled, local_names, start_server, weights_path  # noqa: E402

PASSAGE = (
    "The Kettering Canal was opened in 1794 to carry coal from the northern pits to the river port. "
    "Its engineer, Margaret Holloway, designed eleven locks over a distance of nine miles. "
    "Traffic peaked in 1841 at about 300,000 tons a year and fell after the railway arrived in 1852. "
    "The canal closed to commercial traffic in 1931 and was restored by volunteers between 1978 and 1996. "
)
CONTEXT = PASSAGE * 3  # about 250 tokens, a typical single-passage context

TARGET_SYSTEM = (
    "You answer questions using only the given context. If the context does not allow a single, "
    "certain answer, reply with one refusal code instead: REFUSE_AMBIGUOUS, REFUSE_CONTRADICTORY, "
    "REFUSE_MISSING, REFUSE_FALSE_PREMISE, REFUSE_GRANULARITY, REFUSE_NONFACTUAL. Be brief."
)
VERIFIER_TASK = (
    "You check a perturbed question-answer item. The perturbation class is P-MissingInfo at MEDIUM "
    "intensity: the edit must remove the information needed to answer, so the expected behaviour is "
    "REFUSE_MISSING. Read the original and perturbed items and decide whether the perturbation was "
    "applied as instructed, whether the expected behaviour is right, and explain briefly."
)
GENERATOR_TASK = (
    "You rewrite question-answer items to test whether a reader knows when not to answer. Apply the "
    "lever 'Remove the key fact' (P-MissingInfo, MEDIUM): edit the context so that the fact needed to "
    "answer is gone while the text stays fluent. Keep the question unchanged. Return the perturbed "
    "question, the perturbed context, the expected answer or refusal code, and a one-line rationale."
)

VERDICT_SCHEMA = {
    "type": "object",
    "properties": {
        "perturbation_applied": {"type": "boolean"},
        "expected_behaviour_correct": {"type": "boolean"},
        "explanation": {"type": "string"},
    },
    "required": ["perturbation_applied", "expected_behaviour_correct", "explanation"],
}
CANDIDATE_SCHEMA = {
    "type": "object",
    "properties": {
        "perturbed_question": {"type": "string"},
        "perturbed_context": {"type": "string"},
        "expected_answer": {"type": "string"},
        "rationale": {"type": "string"},
    },
    "required": ["perturbed_question", "perturbed_context", "expected_answer", "rationale"],
}


def _question(i: int) -> str:
    # Vary the item, not the instructions, as a real run does (llama.cpp reuses the shared prefix).
    years = ["opened", "restored", "closed", "reached its peak traffic"]
    return f"Item {i}: in which year was the canal {years[i % len(years)]}?"


def shapes(i: int) -> dict[str, dict[str, Any]]:
    item = f"Context: {CONTEXT}\nQuestion: {_question(i)}"
    return {
        "target": {
            "messages": [{"role": "system", "content": TARGET_SYSTEM}, {"role": "user", "content": item}],
            "max_tokens": 64,
        },
        "verifier": {
            "messages": [
                {"role": "system", "content": VERIFIER_TASK},
                {
                    "role": "user",
                    "content": f"Original:\n{item}\nAnswer: 1794\n\nPerturbed:\n{item.replace('1794', 'the late eighteenth century')}\nExpected: REFUSE_MISSING",
                },
            ],
            "max_tokens": 256,
            "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA}},
        },
        "generator": {
            "messages": [
                {"role": "system", "content": GENERATOR_TASK},
                {"role": "user", "content": f"{item}\nAnswer: 1794"},
            ],
            "max_tokens": 768,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "candidate", "schema": CANDIDATE_SCHEMA},
            },
        },
    }


def chat(client: httpx.Client, api_base: str, model: str, body: dict[str, Any]) -> tuple[float, dict[str, int]]:
    started = time.perf_counter()
    reply = client.post(f"{api_base}/chat/completions", json={"model": model, "temperature": 0.0, **body})
    elapsed = time.perf_counter() - started
    reply.raise_for_status()
    return elapsed, reply.json()["usage"]


def load_seconds(path: Path, n_ctx: int) -> float:
    from llama_cpp import Llama

    started = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=n_ctx, verbose=False)
    elapsed = time.perf_counter() - started
    llm.close()
    return elapsed


def bench_model(name: str, cfg: ModelConfig, models: dict[str, ModelConfig], repeats: int) -> dict[str, Any]:
    assert cfg.local is not None
    row: dict[str, Any] = {"model": name, "size_mb": cfg.local.size / 1e6 if cfg.local.size else float("nan")}
    row["load_s"] = load_seconds(weights_path(name, cfg.local), cfg.local.n_ctx)
    started = time.perf_counter()
    with start_server(models, [name]) as server, httpx.Client(timeout=900) as client:
        row["start_s"] = time.perf_counter() - started
        alias = server.aliases[name]
        chat(
            client, server.api_base, alias, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        )  # warm-up
        # Prompt processing: a long fresh prompt, one output token.
        pp_rates = []
        for i in range(repeats):
            body = {
                "messages": [{"role": "user", "content": f"Run {i} {time.time()}. " + PASSAGE * 10 + "Summarise."}],
                "max_tokens": 1,
            }
            elapsed, usage = chat(client, server.api_base, alias, body)
            pp_rates.append(usage["prompt_tokens"] / elapsed)
        row["pp_tok_s"] = statistics.median(pp_rates)
        # Decode: the same prompt twice; the second call reuses the cached prompt, so its time is decoding.
        tg_rates = []
        for i in range(repeats):
            body = {
                "messages": [
                    {"role": "user", "content": f"Write the numbers from {i + 1} to {i + 400}, separated by commas."}
                ]
            }
            chat(client, server.api_base, alias, {**body, "max_tokens": 1})
            elapsed, usage = chat(client, server.api_base, alias, {**body, "max_tokens": 128})
            tg_rates.append(usage["completion_tokens"] / elapsed)
        row["tg_tok_s"] = statistics.median(tg_rates)
        for shape in ("target", "verifier", "generator"):
            times, outs = [], []
            for i in range(repeats):
                elapsed, usage = chat(client, server.api_base, alias, shapes(i)[shape])
                times.append(elapsed)
                outs.append(usage["completion_tokens"])
            row[f"{shape}_s"] = statistics.mean(times)
            row[f"{shape}_out"] = statistics.mean(outs)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model | size MB | load s | server start s | prompt tok/s | decode tok/s "
        "| target s/call (out tok) | verifier s/call (out tok) | generator s/call (out tok) |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['size_mb']:.0f} | {r['load_s']:.2f} | {r['start_s']:.1f} | {r['pp_tok_s']:.0f} | {r['tg_tok_s']:.1f} "
            f"| {r['target_s']:.1f} ({r['target_out']:.0f}) | {r['verifier_s']:.1f} ({r['verifier_out']:.0f}) "
            f"| {r['generator_s']:.1f} ({r['generator_out']:.0f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="local models (default: all in configs/models.yaml)")
    parser.add_argument("--config", default=str(packaged_config("models.yaml")))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    models = load_config(args.config).models
    names = args.names or local_names(models)
    rows = []
    for name in names:
        cfg = models.get(name)
        if cfg is None or cfg.local is None:
            print(f"skip {name}: not a local model", file=sys.stderr)
            continue
        if not is_pulled(name, cfg.local):
            print(f"skip {name}: weights not pulled (refusalbench models pull {name})", file=sys.stderr)
            continue
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        rows.append(bench_model(name, cfg, models, args.repeats))
    if not rows:
        return 1
    import os

    print(
        f"llama.cpp server, {os.cpu_count()} threads, temperature 0, {args.repeats} calls per figure (mean; rates median)\n"
    )
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
