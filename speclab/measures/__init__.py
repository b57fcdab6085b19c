"""Timed measurements beside the loops: pass and step times of a model (the cost of a guess and of a check),
transformers' own generate() as the peer baseline, contexts where a distribution test has power, and why a greedy
output diverged. May import speclab.decoding, speclab.trees and the floors below.
"""
