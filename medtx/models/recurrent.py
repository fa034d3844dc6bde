"""Recurrent layers (nn.RNN / nn.GRU / nn.LSTM) over right-padded batches, on torch's fused CPU kernel.

On CPU, torch runs a recurrent module over a `PackedSequence` step by step through its generic path, and the
backward pass of that path is slow: a BiLSTM over 16 notes x 512 tokens, one thread, took 3.0-4.0 s for
forward + backward packed and 0.30 s over the padded tensor, where oneDNN's fused kernel runs
(benchmarks/README.md, "Training speed, round 4"). The results at real steps are the same either way:

- a forward-direction layer never reads past a step, so what follows a sequence's end changes nothing
  before it: the padded run's outputs at real steps are the packed run's;
- the reverse direction does read from the end, so it runs as a forward pass, with the reverse weights,
  over each sequence reversed within its own length (`reverse_index`), and its outputs are put back in
  order the same way. Layer by layer, as nn.LSTM stacks them: layer l + 1 reads both directions of layer l,
  with the module's dropout between layers in training.

Outputs after each sequence's end are zeros, as `pad_packed_sequence` gives them. On CUDA, cuDNN runs
packed sequences natively, so `packed=None` keeps the packed path there (not measured here: no GPU).
Recurrent kernels run in fp32 even under bf16 autocast (cuDNN's bf16 RNN support varies).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

RNNModule = nn.RNN | nn.GRU | nn.LSTM


def reverse_index(lengths: Tensor, n_steps: int) -> Tensor:
    """[B, T] index that reverses each row's first n_b steps and leaves its padding in place (an involution)."""
    steps = torch.arange(n_steps, device=lengths.device).unsqueeze(0)
    last = lengths.unsqueeze(1) - 1
    return torch.where(steps <= last, last - steps, steps)


def real_steps(lengths: Tensor, n_steps: int) -> Tensor:
    """[B, T] True at each row's first n_b steps."""
    return torch.arange(n_steps, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def time_gather(x: Tensor, index: Tensor) -> Tensor:
    """[B, T, D] rows of `x` taken along time by `index` [B, T] (e.g. `reverse_index`, which undoes itself)."""
    return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def _one_direction(kind: type, input_size: int, hidden_size: int, bias: bool, nonlinearity: str) -> nn.Module:
    """A one-layer, one-direction module of `kind` on the meta device: a template that `functional_call` runs
    with another module's weights (on meta it allocates nothing and draws no random numbers; about 0.4 ms to
    build, so each call builds its own rather than sharing one that functional_call mutates)."""
    extra = {"nonlinearity": nonlinearity} if kind is nn.RNN else {}
    return kind(input_size, hidden_size, num_layers=1, bias=bias, batch_first=True, device="meta", **extra)


def _direction(rnn: RNNModule, layer: int, reverse: bool, x: Tensor) -> Tensor:
    """Outputs [B, T, H] of one layer and direction of `rnn` run forward over `x` [B, T, in]."""
    suffix = "_reverse" if reverse else ""
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if rnn.bias else [])
    weights = {f"{name}_l0": getattr(rnn, f"{name}_l{layer}{suffix}") for name in names}
    template = _one_direction(type(rnn), x.shape[-1], rnn.hidden_size, rnn.bias, getattr(rnn, "nonlinearity", ""))
    return functional_call(template, weights, (x,))[0]


def _padded(rnn: RNNModule, x: Tensor, lengths: Tensor) -> Tensor:
    if not rnn.bidirectional:
        return rnn(x)[0]  # the whole module at once: inter-layer dropout included
    order = reverse_index(lengths, x.shape[1])
    for layer in range(rnn.num_layers):
        if layer > 0:
            x = F.dropout(x, rnn.dropout, rnn.training)
        backward = time_gather(_direction(rnn, layer, True, time_gather(x, order)), order)
        x = torch.cat([_direction(rnn, layer, False, x), backward], dim=-1)
    return x


def run_recurrent(rnn: RNNModule, x: Tensor, lengths: Tensor, packed: bool | None = None) -> Tensor:
    """Outputs [B, T, H x directions] of `rnn` (batch_first) over right-padded `x` [B, T, in] with `lengths`
    real steps per row (0 counts as 1, so an empty row still reads its first step); zeros after each row's end.

    `packed`: run over a PackedSequence (the generic path) instead; None = on CUDA only."""
    if not rnn.batch_first or getattr(rnn, "proj_size", 0):
        raise ValueError("run_recurrent takes batch_first recurrent modules without proj_size")
    lengths = lengths.clamp(min=1)
    packed = x.is_cuda if packed is None else packed
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = x.float()
        if packed:
            sequence = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            return pad_packed_sequence(rnn(sequence)[0], batch_first=True, total_length=x.shape[1])[0]
        out = _padded(rnn, x, lengths)
    return out * real_steps(lengths, x.shape[1]).unsqueeze(-1).to(out.dtype)


def last_outputs(outputs: Tensor, lengths: Tensor) -> Tensor:
    """[B, H]: each row's output at its last real step (a one-direction top layer's final hidden state)."""
    last = (lengths.clamp(min=1) - 1).view(-1, 1, 1).expand(-1, 1, outputs.shape[-1])
    return outputs.gather(1, last).squeeze(1)
