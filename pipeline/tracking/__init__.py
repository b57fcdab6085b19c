"""MLflow for the pipeline: the tracker (runs, params, metrics, tags, dead runs closed), how runs look in the UI (names
of what varies, rounded headline), secrets kept out of every file, and the machine a run names. May import
pipeline.config, speclab and store.
"""
