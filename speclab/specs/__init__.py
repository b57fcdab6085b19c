"""What a measurement compares, as plain data: arms (a configuration beside plain decoding), tree shapes, prompt pools.
Pure Python, no torch; imports nothing of speclab but itself, so that the store and the analysis can read arms.
"""
