"""``refusalbench view``: a local, read-only web app over run folders.

``folders`` opens run folders through the artifact store and says what kind each is;
``data`` loads a RefusalBench run's tables once into pandas and answers item queries page by
page; ``knowornot_data`` does the same for a KnowOrNot run; ``compare`` sets two RefusalBench
runs side by side; ``textdiff`` marks what a perturbation changed; ``pages`` renders HTML and
``app`` maps URLs to them (FastAPI). No Prefect here: the CLI command lives in ``flows/cli_view.py``.
"""
