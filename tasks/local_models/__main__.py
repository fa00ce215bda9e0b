"""``python -m refusalbench.tasks.local_models``: the llama.cpp server process ``start_server`` launches."""

from refusalbench.tasks.local_models.server_process import main

main()
