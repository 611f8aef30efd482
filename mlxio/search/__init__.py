"""Search-side I/O: embedding texts with a trained encoder, the stored embedding index."""
