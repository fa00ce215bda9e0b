"""The Prefect runtime: every @task, every flow-side step, fan-out, the Prefect UI, the local API. The only layer of tasks/ that imports Prefect."""
