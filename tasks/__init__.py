"""RefusalBench pipeline stages: pure functions, each with a thin Prefect task layer."""

__version__ = "0.1.0"
