"""The Prefect runtime: every @task, every flow-side step, fan-out, the Prefect UI, the embedded mode's background Prefect server. The only layer of tasks/ that imports Prefect."""

# Pure code's narration (core.narration) reaches the Prefect UI once any pipeline module is loaded.
from refusalbench.tasks.pipeline import ui as _ui  # noqa: F401
