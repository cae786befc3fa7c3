"""`spcli calibrate`: measure which speculator layer and observation window find what matters for a model."""
