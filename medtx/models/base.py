"""What every neural model in medtx returns: logits, an optional loss, and (in eager mode) attention.

Contract shared by the EHR models (medtx/models/*.py), the text models and the trainer:

- A model is an `nn.Module` whose `forward(batch, output_attentions=False)` takes the dict produced by
  its collate function (tensors, plus optional non-tensor keys such as "tokens") and returns `ModelOutput`.
- `logits` is [B, n_labels] for multi-label and binary (one logit per label, sigmoid) tasks,
  [B, n_classes] for multi-class (softmax) tasks. `loss` is set when the batch holds "labels".
- `attentions` maps a module name ("conditions", "encoder", "decoder_cross", "bert", ...) to a tuple with
  one tensor per layer of shape [B, heads, queries, keys] (rows sum to 1 over keys);
  `attention_tokens` maps the same names to (query labels, key labels), one list of strings per sample,
  so weights can be stored against readable codes/tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class ModelOutput:
    logits: Tensor
    loss: Tensor | None = None
    attentions: dict[str, tuple[Tensor, ...]] | None = None
    attention_tokens: dict[str, tuple[list[list[str]], list[list[str]]]] = field(default_factory=dict)
