"""KnowOrNot: out-of-knowledge-base robustness with leave-one-out experiments.

The pipeline's parts, one module per concern (the flow is ``flows/knowornot.py``):

- ``records``       typed records (Parquet via ``tasks.records``)
- ``sources``       QA files (JSONL, PolicyBench JSON) and pairs made from facts
- ``sentences``     reading .txt/.md documents and offline NLTK Punkt sentence splitting
- ``diversity``     keyword (TF-IDF) and semantic (embedding) diversity filters
- ``embeddings``    all-MiniLM-L6-v2 loaded offline, a deterministic test embedder, ``EMBEDDERS``
- ``retrieval``     FAISS index, retrieval strategies (``RETRIEVERS``) with leave-one-out, grid
- ``evaluation``    evaluation specs (``EVAL_SPECS``), tag extraction, abstention/factuality metrics
- ``registry``      the name -> strategy registries behind the decorators
- ``labels``        stratified sampling, label storage, agreement, a run folder's labels
- ``labelling_ui``  the terminal and web labellers
- ``llm_stages``    the model-calling steps, pure functions over the gateway
- ``stages``        the Prefect tasks of the flow (files in the run folder in and out)
- ``overlap``       the duplicate-overlap audit of the kept questions (paper App. D.1)
- ``report``        results table, rates, audit and label sample of a run
- ``report_page``   the HTML report, rebuilt from the run folder (``report_figures``: its plots)

Only ``llm_stages`` (through the gateway) and ``stages`` call models; everything else
takes the model's texts (or their embeddings) as arguments.
Submodules are not imported here because some of them pull in heavy libraries
(faiss, torch) that not every caller needs.
"""
