"""One line under each figure of the report: what it shows and how to read it (the report prints each under its
figure; docs/analysis.md points here)."""
from __future__ import annotations

CAPTIONS = {
    "step_time_vs_pass_length.png": "Median pass time of the target and the draft against the number of new tokens "
                                    "in the pass (after the prompt); c_verify(k) is the target's time at k+1 tokens "
                                    "over its time at 1.",
    "speedup_map.png": "Predicted speed-up over (alpha, k) from the measured costs (c_draft = draft step / target "
                       "step, c_verify = verification pass / target step): blue wins, red loses, the black line is "
                       "break-even; dots are each kind's measured alpha at its best measured k.",
    "alpha_by_k.png": "Acceptance rate (accepted / checked proposals) per kind at each k; flat lines mean alpha is a "
                      "property of text and pair, not of k.",
    "tokens_per_pass.png": "Tokens per target pass, measured (solid) against the i.i.d. formula (dashed); a measured "
                           "line below the dashed one means acceptances cluster (not independent).",
    "speedup_predicted_vs_measured.png": "Measured speed-up (median over adjacent-run ratios, 95% distribution-"
                                         "free interval) against both predictors, per kind and k; 1.0 = plain decoding.",
    "strategies.png": "Per kind (fastest first): the draft model's best fixed k, the two adaptive k policies and "
                      "prompt lookup's best fixed k, median speed-up with 95% distribution-free interval; overlapping "
                      "intervals are a tie (the best fixed k is picked after the fact, so it is optimistic).",
    "sampled_alpha.png": "Acceptance rate per kind under greedy and sampled decoding, over the k measured in every "
                         "setting; sampling lowers alpha because the draft must match a distribution, not an arg-max.",
    "time_model_speedup.png": "Held-out prompts: measured speed-up (median of adjacent-run ratios, 95% distribution-"
                              "free interval) against the time model (replaying each prompt's own acceptance run, with "
                              "the interval over prompts; and replaying the calibration prompts of the same kind) "
                              "and the i.i.d. formula, per kind and k.",
    "time_model_decomposition.png": "Milliseconds per generated token by part: predicted by the time model (left, "
                                    "hatched) and measured by the loop's stopwatches in the speed runs (right); the "
                                    "measured draft bar includes the catch-up, which only the model can separate.",
    "drift.png": "Step times taken before against after each speed job; points outside the grey band (flagged "
                 "crosses) changed speed mid-job and are left out of the fits.",
    "distribution_rejections.png": "Share of distribution tests rejected at p < 0.01 (left) and the simulated power "
                                   "against the wrong rules (right): the correct rule should be rejected about 1% "
                                   "of the time, the wrong ones always.",
    "batch_pass_time.png": "Left: the target's pass over B rows x n new tokens. Right: the same over the one-token "
                           "step at that B, i.e. c_verify(B, k = n - 1); a flat line at 1 means checking k proposals "
                           "costs no more than one step.",
    "batch_speedup.png": "Measured speed-up of batched speculative over batched plain decoding (tokens/s summed over "
                         "rows, median of adjacent-run ratios with 95% distribution-free intervals) against the chapter's "
                         "formula at that B (dashed) and the time model at that B (dotted).",
    "tree_pass_curve.png": "The target's pass over 1 + n tree nodes in one-token steps, against a causal (chain) "
                           "pass over as many tokens.",
}
