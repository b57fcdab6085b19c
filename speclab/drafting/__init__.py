"""How a job drafts, chosen and replayed: a strategy (drafter, the k policy that sizes its proposals, the prices it
reads) and greedy acceptance replayed at any k without running the loop, with the reference it needs and its check
against the real loop. The drafter and k-policy classes themselves are parts of the step (speclab.decoding). May
import every speclab floor but speclab.engines.
"""
