"""What a prediction shows a person: heatmaps placed in level-0 coordinates, the tissue check, the share of
attention inside outlines, localisation scores, and suggestions of where to teach next."""
