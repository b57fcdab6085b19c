"""The store: where results live, what names them and what they record. No torch, Hydra or OmegaConf.

    layout      outputs/campaigns/<campaign>/<stage>/<pair>-<config hash>.parquet: stage and campaign names, paths
    files       atomic writes
    records     a stage file: its schema, its provenance record and content hash (write, read, check), the git commit it names
    manifest    published campaigns: PUBLISHED lists every file's sha256 (python -m store.manifest CAMPAIGN publishes)
    seal        PUBLISHED.sha256: which campaigns are published, with their manifests' sha256 (a lost manifest is caught)
    extend      adding a job to a published campaign on purpose (python -m store.extend CAMPAIGN -- OVERRIDES)
    credentials  credentials in URIs: found, masked for every record and line, made connectable
    identity    config identity: a job's config hash, and the keys that say where it ran rather than what it measured
    compat      keys and columns added after results were stored, at the values that reproduce them
    plans       the latest plan
    best_fixed  the best fixed configuration of a campaign's exploratory checks
    mlflow_probe  is an MLflow tracking store usable (the side channel both the pipeline and the analysis log to)
    locks       file locks that die with their process: one writer per job, one creator per sqlite store

The pipeline (``pipeline/``) writes through it and the analysis (``analysis/``) reads through it; both pass
plain data (paths, nested dicts), so a Hydra config is turned into a dict by the pipeline first.
"""
