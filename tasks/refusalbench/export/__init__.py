"""``refusalbench export``: a run's benchmark as a Hugging Face dataset with its card."""
