"""The encoders as pure functions of HF-keyed trees (`bert`, `t5`, their norms `norm`, shapes from
a config dict `hf_config`) and the causal LM's static decode step (`decode_step`, its fused
Llama / Qwen2 form `decode_fused`)."""
