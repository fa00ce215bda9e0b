"""Refresh rounds: how fresh a round is, how large it must be, and the trend across rounds."""
