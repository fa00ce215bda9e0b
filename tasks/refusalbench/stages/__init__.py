"""RefusalBench's stages as pure functions, one module per stage: lever assignment, pre-test,
generation (with edit-style edits, pre-checks and the change summary), verification, selection, the
generator-verifier analysis, respond and judge; what each stage's rows came to."""
