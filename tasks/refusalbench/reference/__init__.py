"""The RefusalBench paper's own reported figures, shipped as reference data to show beside a user's results."""
