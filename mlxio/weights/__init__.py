"""Weights in and out: safetensors / GGUF reading, encoders, causal LMs, quantisation, exports."""
