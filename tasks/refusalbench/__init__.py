"""RefusalBench (generative evaluation of selective refusal): pure logic of every stage, scoring and the report. Imports core, llm and labelling."""
