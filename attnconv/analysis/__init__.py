"""What trained attention layers attend to: centers, widths, distances, conv-likeness.

The numbers behind Figures 4, 12 and 14 of the paper (each head's center and width per
layer) and Figures 5 and 6 (attention maps around a query pixel), for any run directory
of an attention classifier, or for a single layer:

    from attnconv.analysis import analyze_run, analyze_layer
    report = analyze_run("runs/sa")                 # dict, JSON-ready (or a `attnconv.runs.Run`)
    print(format_analysis(report))
    analyze_layer(layer, (7, 7))                    # one SelfAttention2d or ConvAttention

Which layers a model has and what they see (its attention sites, for classifiers and converted
CNNs alike) is `attnconv.models.sites`; this package measures them.

Coordinates. Everything lives on the layer's token grid (for the classifiers: the image
after the d x d downsampling, image_size // d tokens a side). A shift delta = k - q =
(row, column) goes from the query pixel q to the key pixel k, rows pointing down.

Numbering. Layers and heads count from 1 ("layer", "head", "degenerate_heads"), as in the
paper, the figures, the report and the explorer; grid coordinates count from 0.

Per head:
  - center: the quadratic encoding's Delta_h (Lemma 2) when the layer has one
    ("parameter"), else the probability-weighted mean shift seen from the query in the
    middle of the grid ("mean shift"). `mean_shift` is reported for every head.
  - width: isotropic heads A = -alpha ||delta - Delta||^2, alpha = a^2 / 2 (the code's
    Sigma^-1 = a^2 I); every quadratic head also gets its inverse covariance Sigma^-1
    (A = -1/2 (delta - Delta)^T Sigma^-1 (delta - Delta)), its eigenvalues and condition number.
  - avg_distance: E ||delta|| under the head's probabilities, averaged over the interior
    queries (those not on the outer ring of the grid; all queries if the grid has no interior).
  - mass_3x3, mass_5x5: the attention mass inside the K x K window around the head's
    (rounded) center, averaged over the queries whose 5x5 window fits the grid (else
    whose 3x3 window fits, else all queries), the same queries for both sizes.
  - entropy: the Shannon entropy of the middle query's probabilities over log(T): 1 is uniform.
  - degenerate: True when any of these holds (the `reasons` list says which):
      alpha < UNIFORM_ALPHA = 1e-2 (largest alpha along any axis for non-isotropic heads):
          the scores barely vary over the grid, the head averages everything;
      condition number of Sigma^-1 > ILL_CONDITIONED = 1e3: the Gaussian is a line, not a
          point (the paper's code flags such heads);
      entropy > UNIFORM_ENTROPY = 0.98: nearly uniform attention, whatever the encoding
          (the only test available for learned and content heads, which have no width).

Per layer, `conv_likeness` is `attnconv.construct.conv_likeness(..., kernel_size=3)`:
the relative Frobenius distance of the layer's linear map to the nearest 3 x 3
zero-padded convolution. It needs input-independent probabilities: content layers are
measured on their probabilities averaged over test images (the average is a
position-only layer with the same value maps); the `probabilities` field says so.
"""

from attnconv.analysis.grid import assignment, grid_likeness, grid_points, match_to_grid
from attnconv.analysis.heads import (
    ILL_CONDITIONED,
    SNAPSHOT_IMAGES,
    UNIFORM_ALPHA,
    UNIFORM_ENTROPY,
    analyze_captured,
    analyze_layer,
    analyze_run,
    analyze_sites,
    format_analysis,
    head_geometry,
    head_snapshot,
    json_ready,
)

__all__ = [
    "ILL_CONDITIONED",
    "SNAPSHOT_IMAGES",
    "UNIFORM_ALPHA",
    "UNIFORM_ENTROPY",
    "analyze_captured",
    "analyze_layer",
    "analyze_run",
    "analyze_sites",
    "assignment",
    "format_analysis",
    "grid_likeness",
    "grid_points",
    "head_geometry",
    "head_snapshot",
    "json_ready",
    "match_to_grid",
]
