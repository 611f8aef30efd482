"""Training as tree operations: pytree helpers (`tree`), LoRA (`lora`), optimizers (`optim`), the
compiled, accumulating step (`step`), GradCache (`grad_cache`), mixed precision (`precision`),
quantisation and QAT (`quant`), recomputed activations (`recompute`), and the shape buckets
compiled steps see (`buckets`)."""
