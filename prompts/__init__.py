"""Jinja2 prompt templates, shipped as data (one file per role and variant)."""

from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent
