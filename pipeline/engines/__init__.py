"""Who runs a job's arms: speclab's own loops or an engine's server (llama.cpp), each a runner behind the same calls,
and the checks that a job's options are ones its engine can run. May import pipeline.jobs and the floors below; the
stages above call them.
"""
