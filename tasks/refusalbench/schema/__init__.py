"""RefusalBench's run-folder schema: typed records (rows of the Parquet tables), JSON files,
every artifact's name, and the benchmark file ``evaluate`` takes."""
