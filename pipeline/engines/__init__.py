"""Who runs a job's requests: the engine seam every stage calls (base.py ``Engine``), and its engines, speclab's own
loops (speclab_runner.py) and llama.cpp's servers (llama_runner.py); the checks that a job's options are ones its
engine can run (option_checks.py). May import pipeline.jobs and the floors below; the stages above call them.
"""
