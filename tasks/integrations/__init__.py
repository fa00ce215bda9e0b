"""Integrations with other evaluation tools (inspect_ai)."""
