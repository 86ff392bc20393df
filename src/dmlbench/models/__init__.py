"""Networks: backbones with named cut points, embedding heads, and the model that joins them."""
