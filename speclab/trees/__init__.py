"""Tree-shaped drafts: the tree and its verifying mask, tree drafters (static, dynamic, prompt lookup), multi-candidate
acceptance rules, keeping the accepted path in the KV cache, the tree loop and its iteration prices. Builds on
speclab.decoding (the same rules, caches and checks) and speclab.specs (tree shapes as data).
"""
