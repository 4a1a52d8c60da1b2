"""SelfAttention2d(stride=...): the strided queries of the full layer, shaped like a strided conv's output."""

import pytest
import torch

from attnconv import SelfAttention2d, effective_kernel
from attnconv.errors import AttnconvError


@pytest.mark.parametrize("encoding", ["quadratic", "learned", "learned-content"])
@pytest.mark.parametrize("size, stride", [((8, 8), 2), ((7, 9), 2), ((9, 7), 3)])
def test_strided_output_is_the_full_output_at_the_strided_queries(encoding, size, stride):
    torch.manual_seed(0)
    full = SelfAttention2d(4, 6, heads=4, encoding=encoding, max_size=9).double()
    strided = SelfAttention2d(4, 6, heads=4, encoding=encoding, max_size=9, stride=stride).double()
    strided.load_state_dict(full.state_dict())  # stride adds no parameter
    x = torch.randn(2, 4, *size, dtype=torch.float64)
    y = strided(x)
    conv = torch.nn.Conv2d(4, 6, 3, stride=stride, padding=1)
    assert y.shape == conv(x.float()).shape  # the strided conv it replaces
    torch.testing.assert_close(y, full(x)[:, :, ::stride, ::stride], rtol=0, atol=1e-12)
    probs = strided.attention_probs(x)  # (B, heads, T_out, T): the strided queries' rows
    assert probs.shape[2] == y.shape[2] * y.shape[3] and probs.shape[3] == size[0] * size[1]


def test_the_effective_kernel_of_a_strided_layer_reproduces_its_output():
    torch.manual_seed(1)
    layer = SelfAttention2d(3, 5, heads=9, encoding="quadratic", stride=2).double()
    x = torch.randn(1, 3, 8, 6, dtype=torch.float64)
    ek = effective_kernel(layer, (8, 6))
    assert ek.out_size == (4, 3)
    torch.testing.assert_close(ek.apply(x), layer(x), rtol=0, atol=1e-12)


def test_stride_is_checked_and_shown():
    with pytest.raises(AttnconvError, match="stride"):
        SelfAttention2d(4, stride=0)
    assert "stride=2" in repr(SelfAttention2d(4, stride=2)) and "stride" not in repr(SelfAttention2d(4))
