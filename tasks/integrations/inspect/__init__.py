"""RefusalBench inside inspect_ai: a task, a scorer, a model provider, and reading inspect's logs."""
