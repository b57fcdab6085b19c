"""The engine seam every stage calls (base.py ``Engine``: one interface, an engine found by the name its rows carry)
and the checks that a job's options are ones its engine can run (option_checks.py). The engines themselves are
packages of their own (engines/). May import pipeline.jobs and the floors below; the stages above call them.
"""
