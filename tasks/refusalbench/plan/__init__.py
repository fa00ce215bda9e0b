"""``refusalbench plan``: the calls, tokens, dollars and hours a config would take, before any call."""
