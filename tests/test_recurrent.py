"""medtx.models.recurrent: the padded (fused-kernel) path gives torch's packed results, outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medtx.models.recurrent import last_outputs, real_steps, reverse_index, run_recurrent

MODULES = [
    (nn.LSTM, {"bidirectional": True}),
    (nn.LSTM, {"bidirectional": True, "num_layers": 2}),
    (nn.GRU, {"bidirectional": True, "bias": False}),
    (nn.GRU, {"num_layers": 2}),
    (nn.RNN, {"nonlinearity": "relu"}),
    (nn.LSTM, {}),
]


def _run(rnn: nn.Module, x: torch.Tensor, lengths: torch.Tensor, packed: bool, upstream: torch.Tensor):
    rnn.zero_grad()
    x = x.clone().requires_grad_(True)
    out = run_recurrent(rnn, x, lengths, packed=packed)
    (out * upstream).sum().backward()
    return out.detach(), x.grad, [p.grad.clone() for p in rnn.parameters()]


@pytest.mark.parametrize(("kind", "options"), MODULES)
def test_padded_path_matches_packed_outputs_and_gradients(kind, options):
    torch.manual_seed(0)
    rnn = kind(8, 6, batch_first=True, **options)
    x = torch.randn(5, 7, 8)
    lengths = torch.tensor([7, 1, 3, 0, 5])  # 0 reads one step, like the packed path's clamp
    upstream = torch.randn(5, 7, rnn.hidden_size * (2 if rnn.bidirectional else 1))
    packed, padded = _run(rnn, x, lengths, True, upstream), _run(rnn, x, lengths, False, upstream)
    torch.testing.assert_close(padded[0], packed[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded[1], packed[1], rtol=1e-4, atol=1e-5)
    for a, b in zip(padded[2], packed[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_reverse_direction_does_not_read_the_padding():
    """A bidirectional module run over the padded tensor as it is would let the padding into the reverse
    direction; changing what sits after a row's end must change nothing at its real steps."""
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 3, batch_first=True, bidirectional=True)
    x = torch.randn(2, 6, 4)
    lengths = torch.tensor([6, 2])
    noisy = x.clone()
    noisy[1, 2:] = 100.0
    a, b = run_recurrent(lstm, x, lengths, packed=False), run_recurrent(lstm, noisy, lengths, packed=False)
    torch.testing.assert_close(a, b)
    assert torch.count_nonzero(a[1, 2:]) == 0  # zeros after the row's end, as pad_packed_sequence gives
    naive = lstm(noisy)[0][1, :2] - lstm(x)[0][1, :2]
    assert naive.abs().max() > 1e-3  # the guard above is not vacuous


def test_padded_path_draws_no_random_numbers():
    lstm = nn.LSTM(4, 3, batch_first=True, bidirectional=True).eval()
    x = torch.randn(2, 5, 4)
    state = torch.random.get_rng_state()
    run_recurrent(lstm, x, torch.tensor([5, 3]), packed=False)  # builds its one-direction templates on meta
    assert torch.equal(state, torch.random.get_rng_state())


def test_helpers():
    lengths = torch.tensor([3, 1, 2])
    assert reverse_index(lengths, 3).tolist() == [[2, 1, 0], [0, 1, 2], [1, 0, 2]]
    assert real_steps(lengths, 3).tolist() == [[True] * 3, [True, False, False], [True, True, False]]
    outputs = torch.arange(18.0).view(3, 3, 2)
    assert last_outputs(outputs, lengths).tolist() == [[4.0, 5.0], [6.0, 7.0], [14.0, 15.0]]


def test_rejects_modules_it_cannot_run():
    with pytest.raises(ValueError, match="batch_first"):
        run_recurrent(nn.GRU(4, 3), torch.randn(2, 5, 4), torch.tensor([5, 3]))
