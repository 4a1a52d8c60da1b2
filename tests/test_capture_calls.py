"""Attention computed through `F.multi_head_attention_forward` outside a plain nn.MultiheadAttention: a module that
calls it itself (CLIP's attention pooling), a subclass's `super().forward` with other arguments or masks, a module
the model does not register. Each is recomputed from the call's own arguments and checked against torch's weights."""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnconv import capture_attention
from attnconv.errors import AttnconvWarning


def torch_weights(mha: nn.MultiheadAttention, t: torch.Tensor, **kwargs) -> torch.Tensor:
    """torch's own per-head probabilities of a batch-first call (B, h, L, S), averaged over the batch."""
    with torch.no_grad():
        return mha(t, t, t, need_weights=True, average_attn_weights=False, **kwargs)[1].double().mean(0)


class Patches(nn.Module):
    """16 patch tokens of 16x16 images (patch 4), then `body`."""

    def __init__(self, body: nn.Module, dim: int = 8):
        super().__init__()
        self.embed, self.body = nn.Conv2d(1, dim, 4, 4), body

    def tokens(self, x):
        return self.embed(x).flatten(2).transpose(1, 2)

    def forward(self, x):
        return self.body(self.tokens(x))


class Functional(nn.Module):
    """Calls F.multi_head_attention_forward itself with an nn.MultiheadAttention's weights (sequence first)."""

    def __init__(self, mha: nn.MultiheadAttention, **extra):
        super().__init__()
        self.mha_weights, self.extra = mha, extra

    def forward(self, t):
        m = self.mha_weights
        s = t.transpose(0, 1)
        return F.multi_head_attention_forward(
            s, s, s, m.embed_dim, m.num_heads, m.in_proj_weight, m.in_proj_bias, None, None, False, 0.0,
            m.out_proj.weight, m.out_proj.bias, training=False, need_weights=False, **self.extra)[0]


class SelfOnly(nn.MultiheadAttention):
    """A self-attention signature: forward(x), through super().forward."""

    def forward(self, x):
        return super().forward(x, x, x)


class Masked(nn.MultiheadAttention):
    """Adds a locality mask and calls super().forward without weights: not the plain module's output."""

    def forward(self, q, k, v, **kwargs):
        L = q.shape[1]
        self.mask = -(torch.arange(L)[None] - torch.arange(L)[:, None]).abs().float()
        return super().forward(q, k, v, attn_mask=self.mask, need_weights=False)


class Listed(nn.Module):
    """Calls its attention as mha(t, t, t): held in a plain list (not registered: no hooks reach it), or as `mha`."""

    def __init__(self, mha, registered: bool = False):
        super().__init__()
        if registered:
            self.mha = mha
        else:
            self.hidden = [mha]

    def forward(self, t):
        mha = self.mha if hasattr(self, "mha") else self.hidden[0]
        return mha(t, t, t)[0]


@pytest.mark.parametrize("seed", range(3))
def test_attention_through_the_functional_form_is_captured_as_torch_computes_it(seed):
    torch.manual_seed(seed)
    x = torch.randn(3, 1, 16, 16)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    mask = torch.randn(16, 16)
    cases = {  # model, the record's path, torch's weights of the same call
        "direct": (Patches(Functional(mha)), "body", {}),
        "direct, masked": (Patches(Functional(mha, attn_mask=mask)), "body", {"attn_mask": mask}),
        "self-attention signature": (Patches(SelfOnly(8, 2, batch_first=True)), "body", {}),
        "unregistered": (Patches(Listed(mha)), "body", {}),
    }
    masked = Masked(8, 2, batch_first=True)
    cases["subclass with a mask"] = (Patches(Listed(masked, registered=True)), "body.mha", None)
    for name, (model, path, kwargs) in cases.items():
        model.eval()
        for m in model.modules():
            if isinstance(m, nn.MultiheadAttention) and m is not mha:
                m.load_state_dict(mha.state_dict())
        with warnings.catch_warnings():
            warnings.simplefilter("error", AttnconvWarning)  # its attention is seen: nothing to warn of
            records = capture_attention(model, x)
        assert [(r.path, r.kind, r.size) for r in records] == [(path, "multi_head_attention_forward", (4, 4))], name
        t = model.tokens(x)
        if kwargs is None:
            kwargs = {"attn_mask": masked.mask}
        want = torch_weights(mha, t, **kwargs)
        torch.testing.assert_close(records[0].probs.double(), want, rtol=1e-5, atol=1e-6, msg=name)


def test_a_subclass_whose_attention_is_not_seen_is_warned_of_in_words_that_hold():
    """A subclass with a forward of other arguments that computes its attention by hand: nothing is captured, and
    the warning says its forward takes other arguments (not that it computes something else)."""

    class ByHand(nn.MultiheadAttention):
        def forward(self, x):
            q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, -1)
            return self.out_proj((q @ k.transpose(-1, -2)).softmax(-1) @ v)

    model = Patches(ByHand(8, 2, batch_first=True)).eval()
    with pytest.warns(AttnconvWarning, match="ByHand subclasses nn.MultiheadAttention and takes other arguments than "
                                             "nn.MultiheadAttention's forward, and no attention computation inside it"):
        assert capture_attention(model, torch.randn(2, 1, 16, 16)) == []


def test_keys_given_already_projected_are_said_not_captured():
    mha = nn.MultiheadAttention(8, 2).eval()

    class Static(nn.Module):
        def forward(self, x):
            s = x.flatten(2).permute(2, 0, 1).repeat(1, 1, 8)  # (16, B, 8)
            static = torch.randn(len(x) * 2, 16, 4)
            return F.multi_head_attention_forward(
                s, s, s, 8, 2, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0, mha.out_proj.weight,
                mha.out_proj.bias, training=False, static_k=static, static_v=static)[0]

    with pytest.warns(AttnconvWarning, match="static_k .* is not captured"):
        assert capture_attention(Static(), torch.randn(2, 1, 4, 4)) == []
