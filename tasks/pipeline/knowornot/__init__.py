"""KnowOrNot's stages on Prefect: its tasks and steps, and the knowledge bases of a run."""
