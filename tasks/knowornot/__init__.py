"""KnowOrNot: out-of-knowledge-base robustness with leave-one-out experiments.

The pure parts of the pipeline live here, one module per concern:

- ``records``     typed records (Parquet via ``tasks.records``) and QA-pair loaders
- ``sentences``   reading .txt/.md documents and offline NLTK Punkt sentence splitting
- ``diversity``   keyword (TF-IDF) and semantic (embedding) diversity filters
- ``embeddings``  all-MiniLM-L6-v2 loaded offline, plus a deterministic test embedder
- ``retrieval``   FAISS index, retrieval strategies with leave-one-out, experiment grid
- ``evaluation``  evaluation specs, tag extraction, abstention/factuality metrics
- ``labels``      stratified sampling, label storage, terminal and web labellers, agreement

Nothing here calls an LLM: steps that need one take the model's texts (or their
embeddings) as arguments, so the flow decides how and when the calls are made.
Submodules are not imported here because some of them pull in heavy libraries
(faiss, torch) that not every caller needs.
"""
