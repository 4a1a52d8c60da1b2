"""Figures of trained attention layers: head centers (Figures 4, 12, 14) and attention maps (Figures 5, 6).

    from attnconv.plots import plot_centers, plot_maps, plot_figures
    plot_centers("runs/sa")                          # runs/sa/centers.png
    plot_maps("runs/sa", query=(3, 3), zoom=7)       # runs/sa/maps.png
    plot_figures("runs/sa", "docs/figures/sa")       # docs/figures/sa-centers.png, sa-maps.png
    plot_centers_history("runs/sa", layer=2)         # runs/sa/centers-layer2.png: Figure 4 over epochs
    plot_distance("runs/sa")                         # runs/sa/distance.png: attention distance over epochs

Coordinates are token-grid coordinates (the image after the model's d x d downsampling):
a shift (row, col) = key - query, rows pointing down as in an image.

Centers. One panel per layer, one color per head. The query pixel is the black square at
(0, 0); each head's center is a dot, with the contours holding 50% (solid) and 90%
(dotted) of its attention mass:
  - quadratic heads: the level sets of their Gaussian, score -1/2 (d - Delta)^T Sigma^-1 (d - Delta).
    Under that (continuous) Gaussian, d^T Sigma^-1 d is chi^2 with 2 degrees of freedom, so
    the ellipse {d^T Sigma^-1 d = -2 ln(1 - m)} holds mass m (circles for isotropic heads;
    ellipses of each head's own covariance for the full-covariance heads of
    sa-quadratic-aniso, as in Figure 12; `gaussian_ellipse` gives their axes and angle);
  - learned and content heads (no center parameter): the probabilities of the query in
    the middle of the grid (content: averaged over test images), contoured at the levels
    that enclose 50% / 90% of the mass (the fewest, most probable pixels), and the center
    is the probability-weighted mean shift.
Centers outside the window are drawn on its edge as open markers.

Maps. Each map is scaled to its own maximum, captioned with it (3 significant digits). A map
with nothing to show (all zero, e.g. a converted CNN's heads whose taps fall off a 1x1 or 2x2
grid, or one value everywhere) is drawn in neutral grey and captioned so (`flat_map_label`).
Layers and heads are numbered from 1 in every figure, as in the paper.

Over training. Attention runs record their heads at initialization and after every epoch
(heads.jsonl, `attnconv.analysis.head_snapshot`); `plot_centers_history` draws one layer
at several epochs (the paper's Figure 4), `plot_distance` each head's mean attention
distance per layer against epochs (ViT's Figure 7). Neither needs the weights.

Figures are written atomically (temporary file, then os.replace); parent folders are created.

Modules: `figures` (drawing attention: numbers in, Figure out; `save_figure`), `results` (the
same for training curves, learn-conv, the confusion matrix and misclassified images),
`run_figures` (a run directory's figures: load, analyze, draw, save).
"""

from attnconv.plots.figures import (
    MASSES,
    NEUTRAL,
    centers_figure,
    check_out,
    conv_heads_figure,
    distance_figure,
    figure_png,
    figure_writer,
    flat_map_label,
    gaussian_ellipse,
    head_colors,
    maps_figure,
    mass_level,
    save_figure,
    snapshot_geometry,
    spread_epochs,
)
from attnconv.plots.results import confusion_figure, curves_figure, learn_conv_figure, misclassified_figure
from attnconv.plots.run_figures import (
    maps_of_run,
    plot_centers,
    plot_centers_history,
    plot_distance,
    plot_figures,
    plot_maps,
)

__all__ = [
    "MASSES",
    "NEUTRAL",
    "centers_figure",
    "check_out",
    "confusion_figure",
    "conv_heads_figure",
    "curves_figure",
    "distance_figure",
    "figure_png",
    "flat_map_label",
    "gaussian_ellipse",
    "head_colors",
    "learn_conv_figure",
    "maps_figure",
    "mass_level",
    "maps_of_run",
    "misclassified_figure",
    "plot_centers",
    "plot_centers_history",
    "plot_distance",
    "plot_figures",
    "plot_maps",
    "save_figure",
    "figure_writer",
    "snapshot_geometry",
    "spread_epochs",
]
