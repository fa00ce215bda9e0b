"""The generation flow: base set -> levers -> generators (fan out) -> verifiers (fan in)
-> consensus filter -> stratified sample -> benchmark.parquet (seed paper §3.3-3.4).

Tasks exchange file names inside the run folder, never DataFrames. One task per
(model, shard); inside a task the calls run concurrently through the gateway.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from refusalbench.flows.common import check_or_raise, chunks, content_digest, configured, model_endpoints, one_model_at_a_time, submit_per_model
from refusalbench.tasks.config import RunConfig, load_config
from refusalbench.tasks.errors import InputError
from refusalbench.tasks.provenance import ManifestRecorder, package_version
from refusalbench.tasks.records import Assignment, BaseItem, BenchmarkItem, Candidate, Verification
from refusalbench.tasks.store import ArtifactStore
from refusalbench.tasks.taxonomy import STRATA


def _concat(store: ArtifactStore, names: list[str], record_type: type) -> list:
    rows: list = []
    for name in names:
        rows.extend(store.read_records(name, record_type))
    return rows


def prepare_inputs(cfg: RunConfig, seed: int):
    """Read and check everything the flow needs before any artifact is written."""
    from refusalbench.tasks.assign import assign_levers, parse_strata, sample_base_items
    from refusalbench.tasks.basesets import load_base_set
    from refusalbench.tasks.levers import load_catalogue

    gen = cfg.generation
    if gen is None:
        raise InputError(str(cfg.source), "the config has no generation section", field="generation")
    if gen.verification == "short_circuit" and gen.filter != "unanimous":
        raise InputError(str(cfg.source), "verification: short_circuit needs filter: unanimous", field="generation.verification")
    items = sample_base_items(load_base_set(cfg.resolve_path(gen.base_set)), gen.base_sample, seed)
    levers = load_catalogue()
    try:
        strata = parse_strata(gen.strata) if gen.strata else None
    except ValueError as exc:
        raise InputError(str(cfg.source), str(exc), field="generation.strata") from None
    assignments = assign_levers(items, levers, seed=seed, levers_per_stratum=gen.levers_per_stratum, strata=strata)
    return items, levers, assignments, strata


@flow(name="refusalbench-generate", log_prints=True)
def generation_flow(config_path: str, out: str, seed: int | None = None) -> dict[str, Any]:
    from refusalbench.tasks.generate import generate_shard_task
    from refusalbench.tasks.gv_analysis import gv_analysis, matrix_rows
    from refusalbench.tasks.levers import catalogue_hash
    from refusalbench.tasks.ui_artifacts import publish_markdown, publish_table
    from refusalbench.tasks.prompting import all_template_hashes
    from refusalbench.tasks.select import benchmark_items, filter_candidates, stratified_sample
    from refusalbench.tasks.verify import skipped, verify_shard_task

    cfg = load_config(config_path)
    gen = cfg.generation
    seed = gen.seed if seed is None else seed
    items, levers, assignments, strata = prepare_inputs(cfg, seed)
    store = ArtifactStore(out)
    recorder = ManifestRecorder(store, "generate", config=cfg, seed=seed)
    hashes = {"catalogue": catalogue_hash(levers), "prompts": all_template_hashes()}
    recorder.hashes(catalogue=hashes["catalogue"], prompts=hashes["prompts"])
    config_dump = cfg.model_dump(mode="json")
    items_by_id = {item.id: item for item in items}
    try:
        with recorder.stage("assign"):
            store.write_records("base_items.parquet", items, BaseItem)
            store.write_records("assignments.parquet", assignments, Assignment)
            recorder.count(base_items=len(items), assignments=len(assignments))
        generators = check_or_raise(cfg, gen.generators)
        verifiers = check_or_raise(cfg, gen.verifiers)
        with model_endpoints(cfg, generators + verifiers) as api_bases:
            with recorder.stage("generate"):
                shard_names = []
                for index, chunk in enumerate(chunks(assignments, gen.shard_size)):
                    name = f"_work/assignments-{index:04d}.parquet"
                    store.write_records(name, chunk, Assignment)
                    shard_names.append((name, content_digest([a.model_dump() for a in chunk],
                                                      [items_by_id[a.base_id].model_dump() for a in chunk],
                                                      hashes, package_version())))
                generate = generate_shard_task(out)
                futures = submit_per_model(generate, generators,
                                           lambda g: [(config_dump, out, g, name, digest, api_bases) for name, digest in shard_names],
                                           sequential=one_model_at_a_time(cfg, generators))
                candidates: list[Candidate] = _concat(store, [f.result() for g in generators for f in futures[g]], Candidate)
                store.write_records("candidates.parquet", candidates, Candidate)
                recorder.artifact("candidates.parquet")
                recorder.count(candidates=len(candidates),
                               candidates_by_status={s: sum(c.status == s for c in candidates) for s in ("ok", "parse_error", "call_error")})

            with recorder.stage("verify"):
                verify = verify_shard_task(out)
                verifications: list[Verification] = []
                pending = [c for c in candidates if c.status == "ok"]
                rounds = [[v] for v in verifiers] if gen.verification == "short_circuit" else [verifiers]
                for round_index, round_verifiers in enumerate(rounds):
                    shards = []
                    for index, chunk in enumerate(chunks(pending, gen.shard_size)):
                        name = f"_work/verify-input-{round_index:02d}-{index:04d}.parquet"
                        store.write_records(name, chunk, Candidate)
                        shards.append((name, content_digest([c.model_dump() for c in chunk], hashes, package_version())))
                    futures = submit_per_model(verify, round_verifiers,
                                               lambda v: [(config_dump, out, v, name, digest, api_bases)
                                                          for name, digest in shards if pending],
                                               sequential=one_model_at_a_time(cfg, verifiers))
                    round_rows = _concat(store, [f.result() for v in round_verifiers for f in futures[v]], Verification)
                    verifications.extend(round_rows)
                    if gen.verification == "short_circuit":
                        failed = {r.candidate_id for r in round_rows if r.verdict != "PASS"}
                        later = [v for r in rounds[round_index + 1 :] for v in r]
                        verifications.extend(skipped(c, v) for c in pending if c.candidate_id in failed for v in later)
                        pending = [c for c in pending if c.candidate_id not in failed]
                store.write_records("verifications.parquet", verifications, Verification)
                recorder.artifact("verifications.parquet")
                recorder.count(verifications=len(verifications),
                               verifications_by_verdict={v: sum(r.verdict == v for r in verifications)
                                                         for v in ("PASS", "FAIL", "ERROR", "SKIPPED")})

        with recorder.stage("select"):
            decisions = filter_candidates(candidates, verifications, verifiers, gen.filter)
            accepted_ids = {d.candidate_id for d in decisions if d.accepted}
            accepted = [c for c in candidates if c.candidate_id in accepted_ids]
            assigned = {(a.perturbation_class, a.intensity) for a in assignments}
            sample_strata = [s for s in STRATA if s in assigned]
            sample, shortfalls = stratified_sample(accepted, gen.target_size, seed, sample_strata)
            bench = benchmark_items(sample, items_by_id)
            store.write_records("benchmark.parquet", bench, BenchmarkItem)
            store.write_json("filter_decisions.json", [d.model_dump() for d in decisions])
            recorder.artifact("benchmark.parquet", "filter_decisions.json")
            recorder.count(accepted=len(accepted), sampled=len(bench), shortfalls=shortfalls)
            if shortfalls:
                recorder.note(f"{len(shortfalls)} strata have fewer accepted items than their quota (natural imbalance, "
                              f"see counts.shortfalls)")

        with recorder.stage("analyse"):
            analysis = gv_analysis(store.read_frame("candidates.parquet"), store.read_frame("verifications.parquet"),
                                   accepted_ids, {b.item_id for b in bench}, generators, verifiers)
            analysis["filter"] = gen.filter
            analysis["shortfalls"] = shortfalls
            store.write_json("gv_analysis.json", analysis)
            recorder.artifact("gv_analysis.json")
            publish_table("gv-pass-rate-matrix", matrix_rows(analysis), "Pass rate: generator (rows) x verifier (columns)")
            publish_table("gv-acceptance-funnel", [analysis["funnel"]], "attempted -> parsed -> verified -> accepted -> sampled")
            publish_markdown("gv-summary", _summary_markdown(analysis), "Generator-verifier analysis")
        from refusalbench.tasks.prefect_runtime import run_call_stats

        recorder.calls(run_call_stats(config_dump))
        recorder.finish("completed")
    except BaseException:
        recorder.finish("failed")
        raise
    return {"benchmark": store.uri("benchmark.parquet"), "accepted": len(accepted_ids), "sampled": len(bench),
            "candidates": len(candidates), "verifications": len(verifications), "run": store.uri("")}


def _summary_markdown(analysis: dict[str, Any]) -> str:
    funnel = analysis["funnel"]
    lines = ["# Generation funnel", "", " -> ".join(f"{k}: **{v}**" for k, v in funnel.items()), "", "## Self-evaluation bias", ""]
    lines += ["| model | self pass rate | cross pass rate | bias |", "|---|---|---|---|"]
    for model, row in analysis["self_evaluation"].items():
        lines.append(f"| {model} | {row['self_pass_rate']:.3f} | {row['cross_pass_rate']:.3f} | {row['self_evaluation_bias']:+.3f} |")
    lines += ["", "## Verifier agreement (Cohen's kappa)", "", "| a | b | kappa | n | note |", "|---|---|---|---|---|"]
    for row in analysis["verifier_kappa"]:
        lines.append(f"| {row['verifier_a']} | {row['verifier_b']} | {row['kappa']:.3f} | {row['n']} | {row['reason'] or ''} |")
    return "\n".join(lines)


def run_generation(config_path: str, out: str, seed: int | None = None) -> dict[str, Any]:
    """CLI entry: bad input is reported (exit 2) before any artifact is written."""
    cfg = load_config(config_path)
    prepare_inputs(cfg, cfg.generation.seed if seed is None and cfg.generation else (seed or 0))
    # Unreachable models fail here, as one line, before a flow run (and its run folder) starts.
    check_or_raise(cfg, cfg.generation.generators)
    check_or_raise(cfg, cfg.generation.verifiers)
    return configured(generation_flow, cfg, out)(config_path, out, seed)
