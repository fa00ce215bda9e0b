"""RefusalBench (generative evaluation of selective refusal): pure logic of every stage, scoring and the report. Imports core, llm and labelling.

Submodules are imported where they are used; only ``generation_checks`` (light) is imported here, so that
a config read by any process that imported this package has its generation names checked.
"""

from refusalbench.tasks.refusalbench import generation_checks  # noqa: F401
