"""Stage: pre-test. Every pre-test model answers every base item unperturbed; the judge scores them.

One task per (pre-test model, shard of base items), each answering and then judging its shard
(``tasks.pipeline.refusalbench.shard_tasks.pretest_shard``). The whole base set is pre-tested, not a sample: the paper
draws its base sample from the items that passed, so ``base_sample`` applies afterwards
(``GenerationInputs.drawn_from``). Import more items than ``base_sample`` for that reason.
Writes ``pretest.parquet`` (item x model) and records per-model counts in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from refusalbench.tasks.core.provenance import package_version
from refusalbench.tasks.llm.prompting import template_hash
from refusalbench.tasks.pipeline.fanout import content_digest
from refusalbench.tasks.pipeline.refusalbench.assign_step import GenerationInputs
from refusalbench.tasks.pipeline.refusalbench.shard_tasks import pretest_shard
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.pipeline.ui import publish_table
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import BaseItem, PretestRow
from refusalbench.tasks.refusalbench.stages.pretest import kept_items, mark_kept, summary_by_model, summary_rows

# What a pre-test task renders besides its items: part of its content digest.
PRETEST_TEMPLATES = ("target_single.j2", "target_multi.j2", "judge_single.j2", "judge_multi.j2")


@dataclass
class PretestOutcome:
    rows: list[PretestRow]
    kept: list[BaseItem]  # in base-set order
    models: list[str]
    judge: str
    pretested: int

    @property
    def funnel(self) -> dict[str, int]:
        """The pre-test's part of the base-set funnel (imported -> pretested -> kept -> sampled)."""
        return {"pretested": self.pretested, "kept": len(self.kept)}


def pretest_base_set(run: StageRun, items: list[BaseItem], models: list[str], judge: str) -> PretestOutcome:
    """Pre-test ``items`` with ``models`` (all must answer correctly) and ``judge``; see the module doc."""
    gen = run.cfg.generation
    assert gen is not None and gen.pretest is not None, "the pre-test runs only when the config has one"
    fixed = content_digest(
        {name: template_hash(name) for name in PRETEST_TEMPLATES},
        run.cfg.models[judge].model_dump(mode="json"),
        package_version(),
    )
    with run.recorder.stage("pretest"):
        size = run.fanout.shard_size(gen, len(items), [*models, judge])
        shards = run.fanout.write_shards(
            "pretest-items", items, BaseItem, size, lambda chunk: content_digest([i.model_dump() for i in chunk], fixed)
        )
        futures = run.fanout.submit(pretest_shard, models, shards if items else [], sharing=[*models, judge])
        answered: list[PretestRow] = run.fanout.gather(futures, PretestRow)
        kept_ids = kept_items([item.id for item in items], answered, models)
        rows = mark_kept(answered, kept_ids)
        run.store.save(rb_files.PRETEST, rows)
        run.recorder.artifact(rb_files.PRETEST)
        summary = summary_by_model(rows, models)
        run.recorder.count(pretest_rows=len(rows), pretest_by_model=summary)
        skipped = [m for m in gen.pretest.models if m not in models]
        if skipped:
            run.recorder.note(
                f"pre-test without the unavailable model(s) {', '.join(skipped)}: an item was kept "
                f"when the other {len(models)} answered it correctly"
            )
        failed = sum(row.error is not None for row in rows)
        if failed:
            run.recorder.note(
                f"{failed} pre-test answer(s) failed (call or judge error): their items were not kept; "
                f"see the error column of {rb_files.PRETEST.name}"
            )
        publish_table(
            "pretest-by-model",
            summary_rows(summary),
            "Pre-test: base items each model answered correctly unperturbed (a refusal is wrong)",
        )
    return PretestOutcome(rows, [item for item in items if item.id in kept_ids], models, judge, len(items))


def pretested_inputs(
    run: StageRun, inputs: GenerationInputs, models: list[str], judge: str | None
) -> tuple[GenerationInputs, dict[str, int] | None]:
    """The generation inputs drawn from what the pre-test kept, and its part of the funnel;
    ``inputs`` as they are when there is no pre-test (``judge`` None)."""
    if judge is None:
        return inputs, None
    outcome = pretest_base_set(run, inputs.base_set, models, judge)
    return inputs.drawn_from(outcome.kept), outcome.funnel
