"""The lever catalogue, shipped as YAML data (one file per uncertainty class)."""

from pathlib import Path

CATALOGUE_DIR = Path(__file__).parent
