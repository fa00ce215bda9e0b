"""KnowOrNot's stages as pure functions: sentences and sources, the model-calling steps, the
diversity filter, embeddings and retrieval, evaluation, the synthetic out-of-KB check, the overlap audit."""
