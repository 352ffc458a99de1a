"""vLLM's offline API as an engine: runs, checkpoint export, known-bug fixes."""
