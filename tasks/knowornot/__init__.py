"""KnowOrNot: out-of-knowledge-base robustness with leave-one-out experiments.

The pipeline's parts, one module per concern (the flow is ``flows/knowornot.py``):

- ``records``       typed records (Parquet via ``tasks.core.tables``)
- ``documents``     typed JSON documents of the run folder (metrics, overlap audit, specs, agreement)
- ``artifacts``     every file of a KnowOrNot run folder, declared once
- ``sources``       QA files (JSONL, PolicyBench JSON) and pairs made from facts
- ``document_readers`` .txt, .md, .pdf (pypdf) and .html documents as text blocks (``DOCUMENT_READERS``)
- ``sentences``     offline NLTK Punkt sentence splitting
- ``diversity``     keyword (TF-IDF) and semantic (embedding) diversity filters
- ``embeddings``    all-MiniLM-L6-v2 loaded offline, an embedding model through LiteLLM (``api``),
  a deterministic test embedder, ``EMBEDDERS``
- ``retrieval``     FAISS index, retrieval strategies (``RETRIEVERS``) with leave-one-out, grid
- ``evaluation``    evaluation specs (``EVAL_SPECS``), tag extraction, abstention/factuality metrics
- ``config_checks`` the config's knowornot names checked against the registries (imported here)
- ``labels``        stratified sampling and a run folder's labels (store and agreement: ``tasks.labelling``)
- ``label_screens`` the terminal and web labellers
- ``model_steps``   the model-calling steps, pure functions over the gateway
  (their Prefect tasks, flow-side steps and input checks: ``tasks/pipeline/knowornot/``)
- ``overlap``       the duplicate-overlap audit of the kept questions (paper App. D.1)
- ``report``        results table, rates, audit and label sample of a run
- ``report_page``   the HTML report, rebuilt from the run folder (``report_figures``: its plots)

Only ``model_steps`` (through the gateway) and the ``api`` embedder call models; everything else
takes the model's texts (or their embeddings) as arguments.
Submodules are not imported here because some of them pull in heavy libraries
(faiss, torch) that not every caller needs; only ``config_checks`` (light) is, so that a
config read by any process that imported this package has its knowornot names checked.
"""

from refusalbench.tasks.knowornot import config_checks  # noqa: F401  (registers the checks)
