"""The Prefect flows and the command line.

Importing the packages that own registries registers their config checks, so every command
and deployment that reads a config checks its registered names (cache backend, retrieval
strategies, embedder, evaluation specs, strata) before anything is written.

Importing this package starts nothing: the process guard of a flow-run process a worker started
(``tasks/pipeline/process_guard.py``) is installed by each flow as it starts, and by the CLI.
"""

import refusalbench.tasks.knowornot  # noqa: F401
import refusalbench.tasks.llm  # noqa: F401
import refusalbench.tasks.refusalbench  # noqa: F401
