"""Text tools: tokenisers, chunking of long notes, the text models' collates, and the MLM windows and masking of
notes (pre-trained by medtx.training.pretrain). The runs themselves live in medtx/training/runners/."""
