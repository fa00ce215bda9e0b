"""The shared kernel: config, errors, the run folder and its store, provenance, typed records, one registry, one statistics module, one text-input reader. Imports only itself."""
