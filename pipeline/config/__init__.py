"""The job's configuration: the typed schema every Hydra key is declared in once (type, default, range), settings read
from the environment, value checks, which options each stage reads, and the strategies built from config. The lowest
floor of pipeline/: imports speclab and store only.
"""
