"""RefusalBench's stages on Prefect: every model-calling task (``shard_tasks``) and one
``<stage>_step`` per stage (fan out, gather, write, record); refresh rounds."""
