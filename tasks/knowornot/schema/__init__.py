"""KnowOrNot's run-folder schema: typed records, JSON files and every artifact's name."""
