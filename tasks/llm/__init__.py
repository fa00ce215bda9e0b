"""Model access: the gateway, its transports, the call cache, structured outputs, prompts, provider profiles, local and scripted model servers. Imports core.

Importing this package registers the config check of ``cache.backend`` (in ``callcache``).
"""

from refusalbench.tasks.llm import callcache  # noqa: F401  (registers the cache.backend check)
