"""One job from its config to its files: identity (config hash, output path), inputs it reads besides its config, the
arms it runs, its context (models, prompts, strategies), the trust checks, runs in MLflow with their names and
metrics, the verdict and published figures it ends with, its execution (pending stages, one writer, its end), the
job pool, workers, the sweep's bookkeeping and the one-line errors. May import pipeline.config, pipeline.tracking,
pipeline.prompts, speclab, store and analysis's readers.
"""
