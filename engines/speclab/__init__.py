"""speclab's own loops as an engine (the default): the runner (runner.py) that answers the seam with the library's
loops (speclab.decoding, speclab.trees, speclab.drafting, speclab.measures) on the pair loaded in torch, and its
settings (conf.py).
"""
