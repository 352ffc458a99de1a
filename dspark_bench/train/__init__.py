"""Training drafters against a target: data generation, target features, losses, trainer."""
