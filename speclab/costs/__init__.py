"""Pricing speculation from measured costs: the geometric cost model, the time model calibrated on pass timings and
acceptance traces (batch 1 and batched), an engine's speed-up from its own timings and counters, and the planner's
predictions and recommendation. Torch-free; may import speclab.stats and speclab.specs.
"""
