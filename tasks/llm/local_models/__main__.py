"""``python -m refusalbench.tasks.llm.local_models``: the llama.cpp server process ``start_server`` launches."""

from refusalbench.tasks.llm.local_models.server_process import main

main()
