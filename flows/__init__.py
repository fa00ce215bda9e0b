"""The Prefect flows and the command line.

Importing the packages that own registries registers their config checks, so every command
and deployment that reads a config checks its registered names (cache backend, retrieval
strategies, embedder, evaluation specs) before anything is written.
"""

import refusalbench.tasks.knowornot  # noqa: F401
import refusalbench.tasks.llm  # noqa: F401
from refusalbench.tasks.pipeline.process_guard import follow_parent

# Every deployment's entrypoint imports this package: a flow-run process that a worker started
# ends with that worker instead of outliving it (a worker killed alone leaves its children running).
follow_parent()
