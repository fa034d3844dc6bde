"""Clinical text: tokenizers, chunking of long notes, MLM pre-training, text and FAQ experiments."""
