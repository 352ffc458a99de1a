"""Any OpenAI-compatible server as an engine (vLLM, SGLang, TensorRT-LLM, llama.cpp): streamed chat
completions, timed per delivery, with the server's speculative statistics."""
