"""speclab's experiment pipeline: Hydra entry point and one module per measured stage."""
