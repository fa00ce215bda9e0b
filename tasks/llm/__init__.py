"""Model access: the gateway, its transports, the call cache, structured outputs, prompts, provider profiles, local and scripted model servers. Imports core."""
