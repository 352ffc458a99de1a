"""The target model: any Hugging Face causal LM with a batched cache, and the host allocator policy."""
