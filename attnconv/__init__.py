"""attnconv: self-attention and convolution (Cordonnier, Loukas, Jaggi, ICLR 2020)."""

__version__ = "0.1.0"
