"""Model access: the gateway, its transports, the call cache, structured outputs, prompts, provider profiles, local and scripted model servers. Imports core.

Importing this package registers the config checks of ``cache.backend`` (in ``callcache``) and
``limits.backend`` (in ``shared_limits``).
"""

from refusalbench.tasks.llm import (
    callcache,  # noqa: F401  (registers the cache.backend check)
    shared_limits,  # noqa: F401  (registers the limits.backend check)
)
