//! Plimsoll's layer library (not built yet): it will hold modules (Linear, Embedding, LayerNorm,
//! attention), losses, optimizers (SGD, AdamW) and parameter state saved as safetensors.
